"""LM-BFF's SST-2 cells (Gao, Fisch, Chen, ACL 2021, Table 3: RoBERTa-large, K = 16 per class) run with peltbench:
prompt-based zero-shot, prompt-based fine-tuning with the manual prompt (LM-BFF's `prompt`) and with demonstrations
(`prompt-demo`), beside the paper's numbers (results/paper/published/roberta_large_lmbff.csv).

    python scripts/lmbff_sst2.py                                     # the Hub: roberta-large and nyu-mll/glue
    python scripts/lmbff_sst2.py --model /models/roberta-large --data-dir /data/glue_data    # offline

1. zero-shot (LM-BFF's `TYPE=prompt ... --no_train`): the pretrained masked LM with SST-2's prompt scored on the test
   set (SST-2's dev split), no training, in this process through peltbench's own data and model code (runner's
   `prepare_member` and `group_model`, train's `evaluate`); one number, as the paper's (no seed changes it).
2. prompt and prompt-demo: one sweep each, `peltbench -m protocol=lmbff method=ft task=sst2 objective=cloze
   [objective.demonstrations=true] method.lr=1e-5,2e-5,5e-5 ...`: LM-BFF's five splits and its learning-rate grid
   (run_experiment.sh; batch 8, the largest of its grid: docs/protocol.md §10). Rerunning the script skips what is done.
3. `peltbench-tables --protocol protocol=lmbff,objective=cloze[,objective.demonstrations=true] --select method.lr`
   for each: the learning rate chosen on dev, its test mean (std) beside the paper's in
   OUT/<cell>/published_roberta_large_lmbff.md (with --model roberta-large), and the summary printed at the end.

Every option of a run can be changed with --set KEY=VALUE (repeatable), e.g. a short try:
`--seeds 13 --lrs 1e-5 --set train.max_steps=100 --set train.eval_every=50`. The script's test runs it on a tiny
model (tests/test_lmbff_sst2_script.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

LMBFF_SEEDS = (13, 21, 42, 87, 100)   # run_experiment.sh SEED
LMBFF_LRS = (1e-5, 2e-5, 5e-5)        # run_experiment.sh LR "recommendation"
CELLS = {"prompt": ("objective=cloze",), "prompt-demo": ("objective=cloze", "objective.demonstrations=true")}
run_command = subprocess.run  # each sweep and render as a process of its own


def run_overrides(args, cell: str) -> list[str]:
    """What every run of a cell has: LM-BFF's protocol on SST-2, fine-tuning, the cloze objective (with
    demonstrations for prompt-demo), the model and data, and a results folder of the cell's own."""
    data = [f"data.dir={args.data_dir}"] if args.data_dir else []
    return ["protocol=lmbff", "method=ft", "task=sst2", *CELLS[cell], f"model.name={args.model}",
            f"results_dir={Path(args.results_dir) / cell}", *data, *args.set]


def sweep_command(args, cell: str) -> list[str]:
    grid = [f"seed={','.join(map(str, args.seeds))}", f"method.lr={','.join(map(str, args.lrs))}"]
    return [tool("peltbench"), "-m", *run_overrides(args, cell), *grid]


def tables_command(args, cell: str) -> list[str]:
    """The cell's render: its folder holds its runs alone, and the render pools their protocol label (read from
    their records as peltbench-tables reads it; the precision the one most of them used)."""
    results = Path(args.results_dir) / cell
    return [tool("peltbench-tables"), "--results-dir", str(results), "--out", str(Path(args.out) / cell), "--model",
            args.model, "--protocol", protocol_of(results), "--select", "method.lr", "--seeds", str(len(args.seeds)),
            *(["--ddof", "0"] if len(args.seeds) == 1 else [])]  # one seed: no sample std


def protocol_of(results: Path) -> str:
    """The protocol label of a cell's runs, less its precision (`protocol=lmbff,objective=cloze,...`)."""
    from peltbench.tables.comparability import PRECISION, parse_protocol
    from peltbench.tables.records import load_records

    labels = {",".join(f"{key}={value}" for key, value in parse_protocol(label).items() if key != PRECISION)
              for label in load_records(str(results))["protocol"]}
    if len(labels) != 1:
        raise SystemExit(f"{results}: runs of {len(labels)} protocols ({'; '.join(sorted(labels))}); one expected")
    return labels.pop()


def tool(name: str) -> str:
    """A console script of this Python's environment (the venv peltbench is installed in)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def zero_shot(args) -> float:
    """SST-2's test accuracy of the pretrained masked LM with the prompt: peltbench's cloze inputs and head, no step."""
    import torch
    from hydra import compose, initialize_config_module

    from peltbench.model import load_tokenizer
    from peltbench.runner import group_model, prepare_member
    from peltbench.tasks import TaskSpec
    from peltbench.train import EvaluationSet, GroupSettings, evaluate

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*run_overrides(args, "prompt"), f"seed={args.seeds[0]}"])
    device = torch.device(args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    task = TaskSpec.from_config(cfg.task)
    tokenizer = load_tokenizer(str(cfg.model.name))
    member, _ = prepare_member(cfg, task, tokenizer, "zero-shot")
    model = group_model([cfg], task, device)
    model.members.set_active([0], device)
    group = GroupSettings(pad_id=tokenizer.pad_token_id, device=device)
    scores, _ = evaluate(model, [EvaluationSet(member.test, group)], task, group, "zero-shot test")
    return float(scores[0]["main"])


def published_rows(out: Path) -> list[str]:
    """The rows of the published comparison a render wrote (with --model roberta-large), as printed."""
    path = out / "published_roberta_large_lmbff.md"
    if not path.is_file():
        return []
    return [line for line in path.read_text().splitlines() if line.startswith("| ") and "[" in line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="roberta-large", help="a Hub id or a local masked-LM checkpoint folder")
    parser.add_argument("--data-dir", help="a local GLUE folder (SST-2/train.tsv, SST-2/dev.tsv); default: the Hub")
    parser.add_argument("--results-dir", default="results/lmbff_sst2", help="where the records go (a folder per cell)")
    parser.add_argument("--out", default="tables/lmbff_sst2", help="where each cell's tables go")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(LMBFF_SEEDS))
    parser.add_argument("--lrs", type=float, nargs="+", default=list(LMBFF_LRS),
                        help="the learning rates, two or more (the render chooses one on dev: --select method.lr)")
    parser.add_argument("--device", default="auto", help="the zero-shot pass's device (the sweeps': --set device=...)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every run (repeatable), e.g. train.max_steps=100")
    parser.add_argument("--skip", nargs="*", default=[], choices=["zero-shot", *CELLS], help="cells not to run")
    args = parser.parse_args(argv)
    if len(set(args.lrs)) < 2:
        parser.error("--lrs: give two or more learning rates; each cell's render chooses one on dev (LM-BFF's grid)")
    summary = {}
    if "zero-shot" not in args.skip:
        summary["zero-shot"] = zero_shot(args)
        print(f"zero-shot: test accuracy {summary['zero-shot']:.2f} (LM-BFF Table 3, as quoted: 83.6)", flush=True)
    for cell in CELLS:
        if cell in args.skip:
            continue
        for command in (lambda: sweep_command(args, cell), lambda: tables_command(args, cell)):
            line = command()  # the render's after the sweep: its protocol is read from the sweep's records
            print("+", " ".join(line), flush=True)
            status = run_command(line).returncode
            if status:
                print(f"{cell}: {Path(line[0]).name} exited with {status}", file=sys.stderr)
                return status
        summary[cell] = published_rows(Path(args.out) / cell)
    (Path(args.out)).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"summary: {Path(args.out) / 'summary.json'}")
    for cell, rows in summary.items():
        for row in rows if isinstance(rows, list) else []:
            print(f"{cell}: {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
