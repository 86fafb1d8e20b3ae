"""Write every table and figure into the output directory; each writer returns the index entries it made.

An entry is (file names, what they hold). A table without runs is still written, as a note naming the
sweep that fills it; any other file of this tool's names that an earlier render left and this one did
not write is removed (`Output.prune`), so no output outlives its records.
"""
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import latex, markdown
from .captions import (benchmark_words, k_words, main_metrics, metric_words, not_under, reported_heading, reported_rows,
                       selection_rows, statistic_words, sweep_command, unwritten)
from .captions import settings as protocol_node
from .efficiency import efficiency_table, is_fused, machines, without_units
from .figures import bottleneck_figure, gate_figure, gate_runs, lora_scale_figure, most_runs_k
from .layernorm import layernorm_changes, layernorm_figure, mean_changes, saved_ln_runs
from .names import TABLE1_METHODS, TABLE3_METHODS, k_label
from .ledger import other_settings_markdown
from .paper import diff_cells, diff_upper_bounds
from .comparability import Selection, label_protocol, parse_protocol
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
        fit_title(figure)
        laid_out(figure, DPI)
        figure.savefig(self.path(name), dpi=DPI)

    def prune(self):
        """Remove this tool's files that this render did not write; returns their names."""
        stale = sorted(path.name for path in self.folder.iterdir()
                       if path.is_file() and OWN_NAMES.fullmatch(path.name) and path.name not in self.written)
        for name in stale:
            (self.folder / name).unlink()
        return stale


DPI = 150


def laid_out(figure, dpi):
    """Lay `figure` out at `dpi` with its engine (constrained) and drop the engine: savefig with an engine first draws
    the whole figure once only to run it (2.7 s of the 15.9 s saving the cost view's 27-panel figure took under
    cProfile). The same file, byte for byte."""
    engine = figure.get_layout_engine()
    if engine is None or not figure.axes:
        return
    figure.set_dpi(dpi)
    engine.execute(figure)
    figure.set_layout_engine(None)


def fit_title(figure, share=0.96):
    """Break the figure's title at spaces so each line fits `share` of the figure's width (a long title, e.g. the cost
    view's on a figure of one or two panels, would otherwise run off both edges): measured in the title's own font."""
    title = figure._suptitle
    if title is None or not title.get_text():
        return
    from matplotlib.textpath import TextToPath

    measure, font, room = TextToPath(), title.get_fontproperties(), share * figure.get_figwidth() * 72  # points
    lines = []
    for line in title.get_text().split("\n"):
        current = ""
        for word in line.split(" "):
            trial = f"{current} {word}" if current else word
            if current and measure.get_text_width_height_descent(trial, font, False)[0] > room:
                lines.append(current)
                trial = word
            current = trial
        lines.append(current)
    title.set_text("\n".join(lines))


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
    ks: tuple = ()         # the K < all of the pooled runs: what a hint's sweep fills
    selected: str = ""     # with --select: the caption's sentence on the settings chosen on dev (selection.table_caption)
    select_label: str = ""  # with --select: the keys chosen on dev, `method.lr` (selection.Chosen.label)
    tasks: tuple = ()      # the tasks of the pooled runs: the ones a hint's sweep runs
    data_dir: str | None = None  # the local GLUE directory the pooled runs read (`data.dir`), None: the Hub
    written: dict = field(default_factory=dict)  # overrides repeating the label's digests (captions.written_out)


def write_missing(out, name, title, command, why="No runs for this table yet", below=""):
    """A table with no runs: a note in each format naming the sweep that fills it for this render's model and
    protocol (and, in Markdown, the runs of other models or protocols that could)."""
    note = f"{why}: `{command}`, then `make tables`." if command else f"{why}."
    out.text(f"{name}.md", f"# {title}\n\n{note}\n{below}")
    out.text(f"{name}.tex", f"% {title}: {note}\n")
    out.text(f"{name}.csv", "")
    return [(f"{name}.md / .tex / .csv", f"{title}: no runs yet (`{command}`)" if command else f"{title}: {why}")]


def _missing_why(sweep, render):
    """Why a table is empty: no runs yet, or (a few-shot table under a full-data protocol) none can be."""
    return _no_runs(render) if _sweep(sweep, render) else not_under(render.selection)


def write_table1(out, runs, render):
    """Table 1, its significance marks and summary, Table 2 (computed from it), and both "ours − paper"."""
    runs = runs[runs["k"] != "all"]
    below = other_settings_markdown(render.others[render.others["k"] != "all"], render.selection)
    if runs.empty:
        return [*write_missing(out, "table1", "Table 1", _sweep("table1", render),
                               _missing_why("table1", render), below),
                *write_missing(out, "table2", "Table 2", _sweep("table2", render),
                               _missing_why("table2", render), below)]
    table = score_table(runs, render.ddof, ranked_rows(TABLE1_METHODS, runs, render), reported(render))
    ks = _ks(table)
    results = significance(table)
    flagged = {(row.k, row.method, row.task) for row in results.itertuples() if row.significant}
    caption = table1_caption(table, render, runs)
    out.text("table1.md", markdown.score_table_markdown(
        table, f"Table 1: results on {benchmark_words(table.tasks)} with K training examples {_per(render)} (test)",
        caption, render.expected, "Table 1", flagged)
        + below)
    out.text("table1.tex", latex.score_table_latex(
        table, caption + (" *: differs from the best single method, paired t-test over data seeds p < 0.05." if flagged else ""),
        "tab:table1", lambda k: f"[${k_label(k)}${' per class' if _per(render) == 'per class' else ''}] Test Performance",
        render.expected, "Table 1", flagged))
    out.csv("table1.csv", table.cells.astype({"rank": "Int64"}))
    hint = "" if len(results) else (f"\nNo setup has UniPELT and a single method both scored yet: "
                                    f"`{_sweep('table1', render, ks)}` runs them.\n")
    out.text("significance.md", markdown.significance_markdown(results) + hint)
    out.csv("significance.csv", results)
    entries = [("table1.md / .tex / .csv", f"Table 1: {'median' if reported(render) == 'median' else 'mean ± std'} over "
                                          f"data seeds per method, task and K (runs left out: {len(table.problems)})")]
    if render.paper is not None:
        entries += write_diff(out, "table1", "Table 1", diff_cells(table.cells, render.paper["table1"]), table.tasks, render)
    entries.append(("significance.md / .csv", "UniPELT vs. the best single method per task and K (paired over data seeds)"))
    return entries + write_table2(out, table, render, ks)


def write_table2(out, table, render, ks=None):
    bounds = upper_bounds(table.cells)
    caption = ("Average test performance over the tasks of Table 1: each UniPELT variant (the average of its "
               "per-task means, equal to Table 1's Avg. when every seed is present) against the upper bound that "
               "takes, on each task, the best mean of its submodules (max over adapter and prefix-tuning for AP; "
               "adapter, prefix-tuning and LoRA for APL). The larger of each pair is bold. "
               + _selected(render) + render.selection.caption())
    values = bounds.reindex(columns=["upper_ap", "unipelt_ap", "upper_apl", "unipelt_apl"])
    hint = "" if values.notna().any().any() else (
        f"\nNo K has UniPELT and all its submodules on every task yet: `{_sweep('table2', render, ks)}` "
        "runs them.\n")
    out.text("table2.md", markdown.upper_bound_markdown(bounds, caption) + hint)
    out.text("table2.tex", latex.upper_bound_latex(bounds, caption, "tab:table2"))
    out.csv("table2.csv", bounds, index=True)
    entries = [("table2.md / .tex / .csv", "Table 2: UniPELT vs. the upper bound of its submodules, per K")]
    if render.paper is not None:
        diff = diff_upper_bounds(bounds, render.paper["table2"])
        out.text("diff_table2.md", markdown.diff_upper_bound_markdown(diff, _selected(render) + diff_caption(render.selection)))
        out.csv("diff_table2.csv", diff)
        entries.append(("diff_table2.md / .csv", "Table 2, ours − paper per cell"))
    return entries


def write_table3(out, runs, render):
    """Table 3: K = all, one seed by default (conf/experiment/table3.yaml), so cells show std only if more ran."""
    runs = runs[runs["k"] == "all"]
    below = other_settings_markdown(render.others[render.others["k"] == "all"], render.selection)
    if runs.empty:
        return write_missing(out, "table3", "Table 3", _sweep("table3", render),
                             _missing_why("table3", render), below)
    table = score_table(runs, render.ddof, ranked_rows(TABLE3_METHODS, runs, render), reported(render))
    caption = table3_caption(table, runs, render)
    heading, title = reported_heading(table.tasks, halves=settings_dev(render) == "glue_dev_halves")
    out.text("table3.md", markdown.score_table_markdown(
        table, f"Table 3: results with all training examples ({title})",
        caption, table3_seeds(render), "Table 3") + below)
    out.text("table3.tex", latex.score_table_latex(
        table, caption, "tab:table3", lambda k: f"[$K = all$] Best Performance on {heading}", table3_seeds(render),
        "Table 3"))
    out.csv("table3.csv", table.cells.astype({"rank": "Int64"}))
    entries = [("table3.md / .tex / .csv", "Table 3: K = all, including UniPELT-NoGate")]
    if render.paper is not None:
        entries += write_diff(out, "table3", "Table 3", diff_cells(table.cells, render.paper["table3"]), table.tasks, render)
    return entries


def write_diff(out, name, title, diff, tasks, render):
    out.text(f"diff_{name}.md", markdown.diff_markdown(diff, f"{title}: ours − paper", tasks, _selected(render) + diff_caption(render.selection)))
    out.csv(f"diff_{name}.csv", diff)
    return [(f"diff_{name}.md / .csv", f"{title}, ours − paper per cell (paper's number beside it)")]


def diff_caption(selection):
    """Which runs "ours" are, and a warning when the paper's model ran another protocol (`Selection.warning`)."""
    return " ".join(filter(None, [selection.caption(), selection.warning() and f"**{selection.warning()}**"]))


def write_table4(out, runs, render):
    table = efficiency_table(runs)
    if table.empty:
        return write_missing(out, "table4", "Table 4", _sweep("table4", render), _no_runs(render),
                             other_settings_markdown(render.others, render.selection))
    caption = table4_caption(runs, table, render.selection).replace(
        render.selection.caption(), _selected(render) + render.selection.caption())
    warning = render.selection.warning()
    beside = f" **{warning}**" if render.paper and warning else ""  # the paper's numbers stand beside ours
    untimed = "" if table["train_time_percent"].notna().any() else (
        f"\nNo time columns yet: they need fine-tuning and the other methods on the same (task, K), trained unfused "
        f"(fuse=false): `{_sweep('table4', render)}`.\n")
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
            entries.append((name, f"not drawn: no runs for it yet (`{_sweep(sweep, render)}`)"))
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
        entries.append(("fig_gates.png", f"not drawn: no UniPELT runs yet (`{_any_k_sweep(render)}`)"))
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
    objective = parse_protocol(render.selection.protocol).get("objective")  # none: the classifier
    why = None
    if objective is not None:  # no sweep of this render's runs fills it
        why = (f"the LN-tuning paper's Figure 3 is of classifier runs, whose every trained LayerNorm is the encoder's, "
               f"one of its rows; under objective={objective} LN-tuning trains a head's LayerNorm too (cloze: the "
               f"masked-LM head's), which the figure has no row for, so no sweep of these runs is proposed for it")
    elif saved.empty:
        why = f"no LN-tuning run saved its weights; `{_any_k_sweep(render, LN_SWEEP_SETTINGS)}` fills it"
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


def ranked_rows(paper_rows, runs, render):
    """The rows that take bold and underline: beside the paper (its model under its protocol: "ours − paper") only
    the paper table's own rows, so a method the paper did not run never displaces the paper's best (the others are
    set apart); in any other render every method, as a paper's table ranks every method it compares."""
    beside_paper = render.selection.compares_with_paper and label_protocol(render.selection.protocol) == "unipelt"
    return paper_rows if beside_paper else tuple(sorted(set(runs["method"])))


def reported(render):
    """The statistic the pooled runs' protocol reports: "mean" or "median" (peltbench.protocols.statistic)."""
    return statistic(label_protocol(render.selection.protocol))


def table1_caption(table, render, runs):
    """K (in total or per class), the reported rows, each task's metric, the rows that select the best epoch, the
    statistic and the settings (the default or the ones chosen on dev), all as the pooled runs' protocol has them."""
    ks = _ks(table)
    median = reported(render) == "median"
    metrics = main_metrics(runs, table.tasks)
    statistic = statistic_words(reported(render), _seeds(table), render.ddof, render.expected)
    return (f"Results on {benchmark_words(table.tasks)} with {k_words(ks, render.selection)}: test performance on "
            f"{reported_rows(render.selection, ks[0], table.tasks)}, main metric x100 ({metric_words(metrics)}). "
            f"Best epoch (or evaluation step) chosen on: {selection_rows(render.selection, ks[0], table.tasks)}. "
            + f"{statistic}. "
            + f"Avg.: per seed the average over the {_count(len(table.tasks), 'task')}, then "
            f"{'the median' if median else 'mean and std'} over the seeds that have "
            "every task. Best and 2nd best per column and K are bold and underlined. " + _selected(render)
            + render.selection.caption())


def table3_caption(table, runs, render):
    """Table 3's caption: the reported rows and the selection rows as the protocol has them (full_halves reports the
    part of GLUE dev it did not select on), each task's metric, the statistic."""
    metrics = main_metrics(runs, table.tasks)
    return (f"Results on {benchmark_words(table.tasks)} when all training examples are used (K = all): best-epoch "
            "performance on "
            f"{reported_rows(render.selection, 'all', table.tasks)}, main metric x100 ({metric_words(metrics)}). "
            f"Best epoch chosen on: {selection_rows(render.selection, 'all', table.tasks)}. "
            f"{'Median' if reported(render) == 'median' else 'Mean'} over {_seeds(table)} ({table3_seeds(render)} "
            f"seed{'s' if table3_seeds(render) > 1 else ''} expected per cell); "
            f"Avg. over the {_count(len(table.tasks), 'task')}. "
            "Best and 2nd best per column are bold and underlined. " + _selected(render) + render.selection.caption())


def table3_seeds(render):
    """The data seeds a Table 3 cell expects: one under UniPELT's protocol (conf/experiment/table3.yaml), a named
    full-data protocol's seeds otherwise (its statistic is over them)."""
    if label_protocol(render.selection.protocol) == "unipelt":
        return 1
    return len(protocol_node(render.selection).get("seeds") or [1])


def settings_dev(render):
    """The dev source of the render's protocol (`protocol.dev`)."""
    return protocol_node(render.selection)["dev"]


def _ks(table):
    return sorted(set(table.cells["k"]), key=lambda k: (k == "all", int(k) if k != "all" else 0))


def _per(render):
    return "per class" if protocol_node(render.selection)["k"] == "per_class" else "in total"


LN_SWEEP_SETTINGS = ("method=ln", "save.weights=true")  # LN runs that keep their trained LayerNorms (layernorm.SWEEP)


def _sweep(sweep, render, ks=None, extra=()):
    """The sweep that fills an output of this render (captions.sweep_command): at `ks`, the K of the cells a table
    shows; under a protocol of K per class (whose K no experiment file has), at the K of the pooled runs; on the
    render's tasks, from the GLUE directory its runs read (so that it runs offline where they did)."""
    per_class = protocol_node(render.selection)["k"] == "per_class"
    left_out = unwritten(render.selection, render.written)
    note = (f"The sweep commands leave out {', '.join(left_out)}: the label holds only a digest of the runs' value, "
            f"which no override repeats; add it as their records' config holds it")
    if left_out and note not in render.notes:
        render.notes.append(note)
    return sweep_command(sweep, render.selection, ks or (render.ks if per_class else None) or None, extra,
                         render.tasks, render.data_dir, render.written)


def _any_k_sweep(render, extra=()):
    """Table 1's sweep (with `extra` settings), or Table 3's where the protocol runs no few-shot K."""
    return _sweep("table1", render, extra=extra) or _sweep("table3", render, extra=extra)


def _selected(render):
    """With --select, the sentence that says the cells are the settings chosen on dev (empty otherwise)."""
    return f"{render.selected} " if render.selected else ""


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
