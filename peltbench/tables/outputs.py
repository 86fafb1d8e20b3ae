"""Write every table and figure into the output directory; each writer returns the index entries it made.

An entry is (file names, what they hold). A table without runs is still written, as a note naming the
sweep that fills it; any other file of this tool's names that an earlier render left and this one did
not write is removed (`Output.prune`), so no output outlives its records.
"""
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import latex, markdown
from .efficiency import efficiency_table, is_fused, machines, without_units
from .figures import bottleneck_figure, gate_figure, gate_runs, lora_scale_figure, most_runs_k
from .layernorm import SWEEP as LN_SWEEP
from .layernorm import layernorm_changes, layernorm_figure, mean_changes, saved_ln_runs
from .names import TABLE1_METHODS, TABLE3_METHODS, k_label
from .others import other_settings_markdown
from .paper import diff_cells, diff_upper_bounds
from .protocol import PAPER_MODEL, Selection, label_protocol, parse_protocol
from .scores import score_table, statistic, upper_bounds
from .significance import significance

CSV_FLOATS = "%.6g"
# Every name this tool writes; `prune` removes only files of these names.
OWN_NAMES = re.compile(r"(table[1-4]\.(md|tex|csv)|diff_table[1-3]\.(md|csv)|significance\.(md|csv)"
                       r"|selection\.(md|tex|csv)|paired\.(md|csv)|published_\w+\.md"
                       r"|fig[\w-]*\.(png|csv)|other_runs\.md|README\.md)")
FIGURES = {
    "fig2_bottleneck.png": (bottleneck_figure, "Figure 2: adapter score vs. bottleneck size (CoLA, K = 100, or the "
                                               "task and K swept most)", "fig2_bottleneck"),
    "fig3_lora_scale.png": (lora_scale_figure, "Figure 3: LoRA score vs. scaling factor per (task, K)", "fig3_lora_scale"),
}


class Output:
    """The output directory; remembers what this render wrote."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.written = set()

    def path(self, name):
        self.written.add(name)
        return self.folder / name

    def text(self, name, text):
        self.path(name).write_text(text)

    def csv(self, name, frame, index=False):
        frame.to_csv(self.path(name), index=index, float_format=CSV_FLOATS)

    def figure(self, name, figure):
        figure.savefig(self.path(name), dpi=150)

    def prune(self):
        """Remove this tool's files that this render did not write; returns their names."""
        stale = sorted(path.name for path in self.folder.iterdir()
                       if path.is_file() and OWN_NAMES.fullmatch(path.name) and path.name not in self.written)
        for name in stale:
            (self.folder / name).unlink()
        return stale


@dataclass
class Render:
    """What every writer needs besides its runs."""

    selection: Selection
    expected: int          # data seeds a Table 1 cell expects
    ddof: int
    paper: dict | None     # the paper's tables (paper.load_paper), None: no side-by-side
    others: pd.DataFrame   # runs of other models / protocols, listed below Tables 1 and 3
    say: object = print    # one line to the console
    notes: list = field(default_factory=list)


def sweep_command(sweep, selection):
    """`peltbench -m +experiment=table3 model.name=DIR train.epochs=5 precision=fp32`: the sweep that fills an output
    for the model and protocol this render pools (the experiment file alone would run the paper's model and protocol:
    for table3, 56 bert-base-uncased runs from the Hub)."""
    model = selection.model.rpartition("#")[0] or selection.model  # records.split_architectures' PATH#roberta
    settings = [] if model == PAPER_MODEL else [f"model.name={model}"]
    settings += [f"{key}={value}" for key, value in parse_protocol(selection.protocol).items()]
    return shlex.join(["peltbench", "-m", f"+experiment={sweep}", *settings])


def write_missing(out, name, title, command, why="No runs for this table yet", below=""):
    """A table with no runs: a note in each format naming the sweep that fills it for this render's model and
    protocol (and, in Markdown, the runs of other models or protocols that could)."""
    note = f"{why}: `{command}`, then `make tables`."
    out.text(f"{name}.md", f"# {title}\n\n{note}\n{below}")
    out.text(f"{name}.tex", f"% {title}: {note}\n")
    out.text(f"{name}.csv", "")
    return [(f"{name}.md / .tex / .csv", f"{title}: no runs yet (`{command}`)")]


def write_table1(out, runs, render):
    """Table 1, its significance marks and summary, Table 2 (computed from it), and both "ours − paper"."""
    runs = runs[runs["k"] != "all"]
    below = other_settings_markdown(render.others[render.others["k"] != "all"], render.selection)
    if runs.empty:
        return [*write_missing(out, "table1", "Table 1", sweep_command("table1", render.selection), _no_runs(render), below),
                *write_missing(out, "table2", "Table 2", sweep_command("table2", render.selection), _no_runs(render), below)]
    table = score_table(runs, render.ddof, TABLE1_METHODS, reported(render))
    results = significance(table)
    flagged = {(row.k, row.method, row.task) for row in results.itertuples() if row.significant}
    caption = table1_caption(table, render)
    out.text("table1.md", markdown.score_table_markdown(
        table, "Table 1: results on GLUE with K training examples (test)", caption, render.expected, "Table 1", flagged)
        + below)
    out.text("table1.tex", latex.score_table_latex(
        table, caption + (" *: differs from the best single method, paired t-test over data seeds p < 0.05." if flagged else ""),
        "tab:table1", lambda k: f"[${k_label(k)}$] Test Performance", render.expected, "Table 1", flagged))
    out.csv("table1.csv", table.cells.astype({"rank": "Int64"}))
    hint = "" if len(results) else (f"\nNo setup has UniPELT and a single method both scored yet: "
                                    f"`{sweep_command('table1', render.selection)}` runs them.\n")
    out.text("significance.md", markdown.significance_markdown(results) + hint)
    out.csv("significance.csv", results)
    entries = [("table1.md / .tex / .csv", f"Table 1: mean ± std over data seeds per method, task and K (runs left out: {len(table.problems)})")]
    if render.paper is not None:
        entries += write_diff(out, "table1", "Table 1", diff_cells(table.cells, render.paper["table1"]), table.tasks, render)
    entries.append(("significance.md / .csv", "UniPELT vs. the best single method per task and K (paired over data seeds)"))
    return entries + write_table2(out, table, render)


def write_table2(out, table, render):
    bounds = upper_bounds(table.cells)
    caption = ("Average test performance over the tasks of Table 1: each UniPELT variant (the average of its "
               "per-task means, equal to Table 1's Avg. when every seed is present) against the upper bound that "
               "takes, on each task, the best mean of its submodules (max over adapter and prefix-tuning for AP; "
               "adapter, prefix-tuning and LoRA for APL). The larger of each pair is bold. "
               + render.selection.caption())
    values = bounds.reindex(columns=["upper_ap", "unipelt_ap", "upper_apl", "unipelt_apl"])
    hint = "" if values.notna().any().any() else (
        f"\nNo K has UniPELT and all its submodules on every task yet: `{sweep_command('table2', render.selection)}` "
        "runs them.\n")
    out.text("table2.md", markdown.upper_bound_markdown(bounds, caption) + hint)
    out.text("table2.tex", latex.upper_bound_latex(bounds, caption, "tab:table2"))
    out.csv("table2.csv", bounds, index=True)
    entries = [("table2.md / .tex / .csv", "Table 2: UniPELT vs. the upper bound of its submodules, per K")]
    if render.paper is not None:
        diff = diff_upper_bounds(bounds, render.paper["table2"])
        out.text("diff_table2.md", markdown.diff_upper_bound_markdown(diff, diff_caption(render.selection)))
        out.csv("diff_table2.csv", diff)
        entries.append(("diff_table2.md / .csv", "Table 2, ours − paper per cell"))
    return entries


def write_table3(out, runs, render):
    """Table 3: K = all, one seed by default (conf/experiment/table3.yaml), so cells show std only if more ran."""
    runs = runs[runs["k"] == "all"]
    below = other_settings_markdown(render.others[render.others["k"] == "all"], render.selection)
    if runs.empty:
        return write_missing(out, "table3", "Table 3", sweep_command("table3", render.selection), _no_runs(render), below)
    table = score_table(runs, render.ddof, TABLE3_METHODS, reported(render))
    caption = ("Results on GLUE when all training examples are used (K = all): best performance on the GLUE dev "
               f"split, main metric x100, {'median' if reported(render) == 'median' else 'mean'} over {_seeds(table)}; "
               f"Avg. over the {_count(len(table.tasks), 'task')}. "
               "Best and 2nd best per column are bold and underlined. " + render.selection.caption())
    out.text("table3.md", markdown.score_table_markdown(
        table, "Table 3: results with all training examples (dev)", caption, 1, "Table 3") + below)
    out.text("table3.tex", latex.score_table_latex(
        table, caption, "tab:table3", lambda k: "[$K = all$] Best Performance on GLUE Dev", 1, "Table 3"))
    out.csv("table3.csv", table.cells.astype({"rank": "Int64"}))
    entries = [("table3.md / .tex / .csv", "Table 3: K = all, including UniPELT-NoGate")]
    if render.paper is not None:
        entries += write_diff(out, "table3", "Table 3", diff_cells(table.cells, render.paper["table3"]), table.tasks, render)
    return entries


def write_diff(out, name, title, diff, tasks, render):
    out.text(f"diff_{name}.md", markdown.diff_markdown(diff, f"{title}: ours − paper", tasks, diff_caption(render.selection)))
    out.csv(f"diff_{name}.csv", diff)
    return [(f"diff_{name}.md / .csv", f"{title}, ours − paper per cell (paper's number beside it)")]


def diff_caption(selection):
    """Which runs "ours" are, and a warning when the paper's model ran another protocol (`Selection.warning`)."""
    return " ".join(filter(None, [selection.caption(), selection.warning() and f"**{selection.warning()}**"]))


def write_table4(out, runs, render):
    table = efficiency_table(runs)
    if table.empty:
        return write_missing(out, "table4", "Table 4", sweep_command("table4", render.selection), _no_runs(render),
                             other_settings_markdown(render.others, render.selection))
    caption = table4_caption(runs, table, render.selection)
    warning = render.selection.warning()
    beside = f" **{warning}**" if render.paper and warning else ""  # the paper's numbers stand beside ours
    untimed = "" if table["train_time_percent"].notna().any() else (
        f"\nNo time columns yet: they need fine-tuning and the other methods on the same (task, K), trained unfused "
        f"(fuse=false): `{sweep_command('table4', render.selection)}`.\n")
    out.text("table4.md", markdown.efficiency_markdown(
        table, render.paper["table4"] if render.paper else None,
        caption + " Column setups: the (task, K) setups a method's time ratios average over." + beside) + untimed)
    out.text("table4.tex", latex.efficiency_latex(table, caption, "tab:table4"))
    out.csv("table4.csv", table, index=True)
    return [("table4.md / .tex / .csv", "Table 4: trainable parameters, training and inference time relative to fine-tuning")]


def table4_caption(runs, table, selection):
    """What Table 4's columns are (the backbone's size as the records count it), which runs' times were left out,
    and which machines timed the rest."""
    ok = runs[runs["status"] == "ok"]
    caption = ("Trainable parameters (stored per task as docs/protocol.md counts them, classification head excluded; "
               f"% of the backbone's parameters{_backbone_size(table)}) and training / inference time relative to "
               "fine-tuning. Time_T: seconds per training step; Time_I: seconds per test example; each averaged over "
               "seeds per (task, K), divided by fine-tuning's on the same (task, K), then averaged over the setups both "
               "methods ran.")
    fused = int(is_fused(ok).sum())
    if fused:
        caption += (f" {fused} fused run(s) (trained together on one backbone, so their seconds are their group's) "
                    "count in #Param. but are left out of Time_T and Time_I.")
    for units, what, column in (("train_steps", "training steps", "Time_T"), ("test_examples", "test examples", "Time_I")):
        untimed = len(without_units(ok[~is_fused(ok)], units))
        if untimed:
            caption += f" {untimed} run(s) record no {what}: left out of {column}."
    timed_on = machines(ok)
    if timed_on:
        caption += f" Timed on: {', '.join(timed_on)}."
        if len(timed_on) > 1:
            caption += " Warning: times from different machines are not comparable."
    return caption + " " + selection.caption()


def write_figures(out, runs, render):
    """Figures 2 and 3 and UniPELT's gates as PNG; a figure without runs is not drawn (`prune` removes an old one)."""
    entries = []
    for name, (draw, title, sweep) in FIGURES.items():
        figure = draw(runs, render.ddof, expected=render.expected)
        if figure is None:
            entries.append((name, f"not drawn: no runs for it yet (`{sweep_command(sweep, render.selection)}`)"))
            continue
        out.figure(name, _name_the_runs(figure, render.selection))
        entries.append((name, title))
    figure = gate_figure(runs)
    left_out = gate_runs(runs)[1]
    if left_out:
        render.notes.append(f"fig_gates.png leaves out {len(left_out)} record{'s' if len(left_out) > 1 else ''} whose gates "
                            "have another number of layers than the rest: "
                            + "; ".join(f"{path} ({why})" for path, why in left_out))
    if figure is None:
        entries.append(("fig_gates.png", f"not drawn: no UniPELT runs yet (`{sweep_command('table1', render.selection)}`)"))
    else:
        out.figure("fig_gates.png", _name_the_runs(figure, render.selection))
        entries.append(("fig_gates.png", "UniPELT's mean gate per layer and submodule, per task"))
    return entries + write_layernorm_figure(out, runs, render)


def _name_the_runs(figure, selection):
    """A figure's title names the model and protocol it pools, as the tables' captions do."""
    title = figure._suptitle.get_text() if figure._suptitle is not None else ""
    pooled = f"{selection.model_label()}, {selection.protocol}"
    figure.suptitle(f"{title}\n{pooled}" if title else pooled, fontsize="small" if not title else None)
    return figure


def write_layernorm_figure(out, runs, render):
    """The LN-tuning paper's Figure 3 on GLUE from LN runs that saved their weights, and its numbers as CSV."""
    saved = saved_ln_runs(runs[runs["changed"].map(len) == 0])
    why = None
    if saved.empty:
        why = f"no LN-tuning run saved its weights; `{LN_SWEEP}` fills it"
    else:
        changes = layernorm_changes(saved, render.say)
        if changes.empty:
            why = "no saved LN-tuning run could be compared with its pretrained model (see the console)"
    if why:
        render.notes.append(f"fig_ln_change.png not drawn: {why}")
        return [("fig_ln_change.png", f"not drawn: {why}")]
    means = mean_changes(changes)
    k = most_runs_k(changes.drop_duplicates(["task", "k", "seed"]))
    out.figure("fig_ln_change.png", layernorm_figure(means, k))
    out.csv("fig_ln_change.csv", means)
    return [("fig_ln_change.png / .csv", f"LN-tuning paper's Figure 3 on GLUE: change of LayerNorm gain and bias per layer "
                                        f"and task ({k_label(k)}; the CSV has every K, layer 0 = embeddings)")]


def reported(render):
    """The statistic the pooled runs' protocol reports: "mean" or "median" (peltbench.protocols.statistic)."""
    return statistic(label_protocol(render.selection.protocol))


def table1_caption(table, render):
    ks = ", ".join(sorted(set(table.cells["k"]), key=int))
    return (f"Results on GLUE with K = {{{ks}}} training examples: test performance (the official dev split), "
            "main metric x100 (CoLA Matthews corr., MRPC and QQP F1, STS-B Spearman, accuracy for the rest; MNLI matched). "
            + (f"Median over {_seeds(table)} ({render.expected} seeds expected per cell; the protocol's statistic). "
               if reported(render) == "median" else
               f"Mean and standard deviation over {_seeds(table)} (std with ddof = {render.ddof}; {render.expected} seeds expected per cell). ")
            + f"Avg.: per seed the average over the {_count(len(table.tasks), 'task')}, then "
            f"{'the median' if reported(render) == 'median' else 'mean and std'} over the seeds that have "
            "every task. Best and 2nd best per column and K are bold and underlined. " + render.selection.caption())


def _backbone_size(table):
    """`: 124,645,632`, the pooled model's backbone as its records count it (the same for every method)."""
    sizes = set(table["backbone_params"].dropna())
    return f": {int(sizes.pop()):,}" if len(sizes) == 1 else ""


def _no_runs(render):
    selection = render.selection
    return f"No runs for this table yet under model {selection.model_label()} and protocol {selection.protocol}"


def _seeds(table):
    seeds = sorted(set(table.seeds["seed"]))
    return f"data seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}" if seeds else "no data seeds"


def _count(number, noun):
    return f"{number} {noun}{'s' if number != 1 else ''}"
