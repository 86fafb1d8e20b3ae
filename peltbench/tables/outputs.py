"""Write every table and figure into the output directory; each writer returns the index entries it made.

An entry is (file names, what they hold). A table without runs is still written, as a note naming the
sweep that fills it, so an older table of that name does not outlive its records.
"""
from pathlib import Path

from . import latex, markdown
from .efficiency import efficiency_table
from .figures import bottleneck_figure, gate_figure, lora_scale_figure
from .names import k_label
from .paper import diff_cells, diff_upper_bounds
from .scores import score_table, upper_bounds
from .significance import significance

CSV_FLOATS = "%.6g"
FIGURES = {
    "fig2_bottleneck.png": (bottleneck_figure, "Figure 2: adapter score vs. bottleneck size (CoLA, K = 100)", "fig2_bottleneck"),
    "fig3_lora_scale.png": (lora_scale_figure, "Figure 3: LoRA score vs. scaling factor per (task, K)", "fig3_lora_scale"),
    "fig_gates.png": (gate_figure, "UniPELT's mean gate per layer and submodule, per task", "table1"),
}


def write_text(out, name, text):
    (Path(out) / name).write_text(text)


def write_csv(out, name, frame, index=False):
    frame.to_csv(Path(out) / name, index=index, float_format=CSV_FLOATS)


def write_missing(out, name, title, sweep):
    """A table with no runs: a note in each format naming the sweep that fills it."""
    note = f"No runs for this table yet: `peltbench -m +experiment={sweep}`, then `make tables`."
    write_text(out, f"{name}.md", f"# {title}\n\n{note}\n")
    write_text(out, f"{name}.tex", f"% {title}: {note}\n")
    write_text(out, f"{name}.csv", "")
    return [(f"{name}.md / .tex / .csv", f"{title}: no runs yet (`peltbench -m +experiment={sweep}`)")]


def write_table1(out, runs, paper, expected, ddof):
    """Table 1, its significance marks and summary, Table 2 (computed from it), and both "ours − paper"."""
    runs = runs[runs["k"] != "all"]
    if runs.empty:
        return [*write_missing(out, "table1", "Table 1", "table1"), *write_missing(out, "table2", "Table 2", "table2")]
    table = score_table(runs, ddof)
    results = significance(table)
    flagged = {(row.k, row.method, row.task) for row in results.itertuples() if row.significant}
    caption = table1_caption(table, expected, ddof)
    write_text(out, "table1.md", markdown.score_table_markdown(
        table, "Table 1: results on GLUE with K training examples (test)", caption, expected, flagged))
    write_text(out, "table1.tex", latex.score_table_latex(
        table, caption, "tab:table1", lambda k: f"[${k_label(k)}$] Test Performance", expected))
    write_csv(out, "table1.csv", table.cells.astype({"rank": "Int64"}))
    write_text(out, "significance.md", markdown.significance_markdown(results))
    write_csv(out, "significance.csv", results)
    entries = [("table1.md / .tex / .csv", f"Table 1: mean ± std over data seeds per method, task and K (runs left out: {len(table.problems)})")]
    if paper is not None:
        entries += write_diff(out, "table1", "Table 1", diff_cells(table.cells, paper["table1"]), table.tasks)
    entries.append(("significance.md / .csv", "UniPELT vs. the best single method per task and K (Welch's t-test)"))
    return entries + write_table2(out, table, paper)


def write_table2(out, table, paper):
    bounds = upper_bounds(table.cells)
    caption = ("Average test performance over the tasks of Table 1: each UniPELT variant (the average of its "
               "per-task means, equal to Table 1's Avg. when every seed is present) against the upper bound that "
               "takes, on each task, the best mean of its submodules (max over adapter and prefix-tuning for AP; "
               "adapter, prefix-tuning and LoRA for APL). The larger of each pair is bold.")
    write_text(out, "table2.md", markdown.upper_bound_markdown(bounds, caption))
    write_text(out, "table2.tex", latex.upper_bound_latex(bounds, caption, "tab:table2"))
    write_csv(out, "table2.csv", bounds, index=True)
    entries = [("table2.md / .tex / .csv", "Table 2: UniPELT vs. the upper bound of its submodules, per K")]
    if paper is not None:
        diff = diff_upper_bounds(bounds, paper["table2"])
        write_text(out, "diff_table2.md", markdown.diff_upper_bound_markdown(diff))
        write_csv(out, "diff_table2.csv", diff)
        entries.append(("diff_table2.md / .csv", "Table 2, ours − paper per cell"))
    return entries


def write_table3(out, runs, paper, ddof):
    """Table 3: K = all, one seed by default (conf/experiment/table3.yaml), so cells show std only if more ran."""
    runs = runs[runs["k"] == "all"]
    if runs.empty:
        return write_missing(out, "table3", "Table 3", "table3")
    table = score_table(runs, ddof)
    caption = ("Results on GLUE when all training examples are used (K = all): best performance on the GLUE dev "
               f"split, main metric x100, over {_seeds(table)}; Avg. over the {_count(len(table.tasks), 'task')}. "
               "Best and 2nd best per column are bold and underlined.")
    write_text(out, "table3.md", markdown.score_table_markdown(table, "Table 3: results with all training examples (dev)", caption, 1))
    write_text(out, "table3.tex", latex.score_table_latex(
        table, caption, "tab:table3", lambda k: "[$K = all$] Best Performance on GLUE Dev", 1))
    write_csv(out, "table3.csv", table.cells.astype({"rank": "Int64"}))
    entries = [("table3.md / .tex / .csv", "Table 3: K = all, including UniPELT-NoGate")]
    if paper is not None:
        entries += write_diff(out, "table3", "Table 3", diff_cells(table.cells, paper["table3"]), table.tasks)
    return entries


def write_diff(out, name, title, diff, tasks):
    write_text(out, f"diff_{name}.md", markdown.diff_markdown(diff, f"{title}: ours − paper", tasks))
    write_csv(out, f"diff_{name}.csv", diff)
    return [(f"diff_{name}.md / .csv", f"{title}, ours − paper per cell (paper's number beside it)")]


def write_table4(out, runs, paper):
    table = efficiency_table(runs)
    if table.empty:
        return write_missing(out, "table4", "Table 4", "table4")
    caption = ("Trainable parameters (METHODS.md's count, classification head excluded; % of the backbone's "
               "parameters) and training / inference time relative to fine-tuning. Time_T: seconds per training "
               "step; Time_I: seconds per test example; each averaged over seeds per (task, K), divided by "
               "fine-tuning's on the same (task, K), then averaged over the setups both ran (column setups).")
    write_text(out, "table4.md", markdown.efficiency_markdown(table, paper["table4"] if paper else None, caption))
    write_text(out, "table4.tex", latex.efficiency_latex(table, caption, "tab:table4"))
    write_csv(out, "table4.csv", table, index=True)
    return [("table4.md / .tex / .csv", "Table 4: trainable parameters, training and inference time relative to fine-tuning")]


def write_figures(out, records):
    """Each figure as PNG; a figure without runs is not drawn and any older file of that name is removed."""
    entries = []
    for name, (draw, title, sweep) in FIGURES.items():
        figure = draw(records)
        path = Path(out) / name
        if figure is None:
            path.unlink(missing_ok=True)
            entries.append((name, f"not drawn: no runs for it yet (`peltbench -m +experiment={sweep}`)"))
            continue
        figure.savefig(path, dpi=150)
        entries.append((name, title))
    return entries


def table1_caption(table, expected, ddof):
    ks = ", ".join(sorted(set(table.cells["k"]), key=int))
    return (f"Results on GLUE with K = {{{ks}}} training examples: test performance (the official dev split), "
            "main metric x100 (CoLA Matthews corr., MRPC and QQP F1, STS-B Spearman, accuracy for the rest; MNLI matched). "
            f"Mean and standard deviation over {_seeds(table)} (std with ddof = {ddof}; {expected} seeds expected per cell). "
            f"Avg.: per seed the average over the {_count(len(table.tasks), 'task')}, then mean and std over the seeds that have "
            "every task. Best and 2nd best per column and K are bold and underlined.")


def _seeds(table):
    seeds = sorted(set(table.seeds["seed"]))
    return f"data seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}" if seeds else "no data seeds"


def _count(number, noun):
    return f"{number} {noun}{'s' if number != 1 else ''}"
