"""`peltbench-tables` (what `make tables` runs): the paper's Tables 1-4 and Figures 2-3 from result records."""
import argparse
import sys
from pathlib import Path

from .outputs import write_figures, write_table1, write_table3, write_table4, write_text
from .paper import default_paper_dir, load_paper
from .records import default_runs, load_records


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="peltbench-tables",
        description="Regenerate the UniPELT paper's Tables 1-4 and Figures 2-3 from result records, beside the paper's numbers.",
    )
    parser.add_argument("--results-dir", default="results/runs", help="where the runs' result.json files are (searched recursively)")
    parser.add_argument("--out", default="results/tables", help="where the tables and figures go")
    parser.add_argument("--paper-dir", default=str(default_paper_dir()),
                        help="the paper's tables as CSV (default: results/paper of this checkout); absent: no side-by-side")
    parser.add_argument("--seeds", type=int, default=5, help="data seeds a Table 1 cell expects; fewer are shown as n=3 (default 5, App. B)")
    parser.add_argument("--ddof", type=int, default=1, help="delta degrees of freedom of every std (default 1: sample std)")
    parser.add_argument("--model", help="only records of this model.name, when runs of several models share the results dir")
    return parser.parse_args(argv)


def main(argv=None):
    """Console entry point; returns the exit status (1 when there is no record to tabulate)."""
    args = parse_args(argv)
    records = load_records(args.results_dir)
    if args.model:
        records = records[records["model"] == args.model]
    if records.empty:
        which = f" of model {args.model}" if args.model else ""
        print(f"peltbench-tables: no result.json{which} under {args.results_dir}; run a sweep first, "
              "e.g. `peltbench -m +experiment=table1`", file=sys.stderr)
        return 1
    paper = load_paper(args.paper_dir)
    notes = _notes(records, paper, args)
    for note in notes:
        print(f"peltbench-tables: {note}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = default_runs(records)
    entries = [
        *write_table1(out, runs, paper, args.seeds, args.ddof),
        *write_table3(out, runs, paper, args.ddof),
        *write_table4(out, runs, paper),
        *write_figures(out, records),
    ]
    write_text(out, "README.md", index_markdown(records, args, entries, notes))
    print(f"peltbench-tables: {len(records)} records from {args.results_dir} -> {out}/ (index: {out / 'README.md'})")
    return 0


def _notes(records, paper, args):
    """What the reader must know about these outputs: a missing paper, mixed models, runs outside the tables."""
    notes = []
    if paper is None:
        notes.append(f"no paper tables in {args.paper_dir}: the ours - paper comparison is skipped")
    models = sorted(records["model"].dropna().unique())
    if len(models) > 1:
        notes.append(f"records of {len(models)} models are pooled ({', '.join(models)}); choose one with --model")
    swept = len(records) - len(default_runs(records))
    if swept:
        notes.append(f"{swept} records with non-default method settings appear only in the figures")
    return notes


def index_markdown(records, args, entries, notes):
    """README.md of the output directory: where the numbers came from and what each file holds."""
    failed = int((records["status"] != "ok").sum())
    lines = [
        "# Tables and figures regenerated from result records", "",
        f"From {len(records)} records ({failed} failed) under `{args.results_dir}`, by `peltbench-tables` "
        f"(`make tables`); the paper's own tables: `{args.paper_dir}`.", "",
        "| file | what |", "|---|---|",
        *(f"| `{name}` | {what} |" for name, what in entries), "",
    ]
    return "\n".join(lines + [f"- {note}" for note in notes] + [""])
