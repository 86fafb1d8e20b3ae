"""Write a valid record for every run of a sweep, cloned from real records: a results dir of any size, for
benchmarks of peltbench-tables, peltbench-missing and a sweep's start (scripts/benchmark_records.py).

    python scripts/generate_records.py OUT TEMPLATES SWEEP_ARGUMENTS... [--workers N]
    python scripts/generate_records.py /tmp/runs tests/data/tables/minilm_runs method=ft,lora task=rte,cola \
        k=100,500 seed=111,222,333 method.lr=1e-4,5e-4

The grid is the sweep's, expanded and composed as `peltbench-missing` does (peltbench.missing); each run's record is
what peltbench writes for it: its fields from the config (`config`, `identity`, `config_hash`, `variant`, `model`,
`protocol`, `versions`, ...) through peltbench's own functions (runner._identity, record.config_hash,
record.record_path), so peltbench-missing with the same arguments counts every one done and the tables read every
one. What a run measures comes from a real record of TEMPLATES (a directory of result.json files: the one of the
same method and task, else of the same method, else the first): its history, split, timings, parameter counts,
gates (where the run's method is gated) and machine. Its scores are the template's main score moved by a fixed offset drawn
from the run's config_hash (±5 points; dev and test apart), one per metric of the run's task, so a selection on
dev has something to choose. Nothing is trained. The records are plain file writes, one per run folder, in
`--workers` processes (default 2), each composing its own share of the grid; run again on the same OUT, it writes
only the records that are not there (an interrupted generation goes on).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

MEASURED = ("best_epoch", "epochs_run", "architecture", "trainable_params", "head_params", "optimizer_params",
            "backbone_params", "train_seconds", "train_seconds_share", "train_steps", "eval_seconds",
            "eval_seconds_share", "test_seconds", "test_examples", "peak_memory", "machine", "device", "precision",
            "dropout", "history", "split", "data_source")


SPLIT = "\0split\0"  # where the template's formatted split goes


def templates(folder: Path) -> list[dict]:
    found = [json.loads(path.read_text()) for path in sorted(folder.rglob("result.json"))]
    found = [record for record in found if record.get("status") == "ok"]
    if not found:
        sys.exit(f"generate_records: no ok result.json under {folder}")
    return found


def pick(records: list[dict], method: str, task: str) -> dict:
    for match in (lambda r: r["method"] == method and r["task"] == task, lambda r: r["method"] == method):
        chosen = [record for record in records if match(record)]
        if chosen:
            return chosen[0]
    return records[0]


def offset(digest: str, salt: str) -> float:
    """A fixed number in [-5, 5] from the run's config_hash: the same run gets the same scores every time."""
    value = int(hashlib.sha256(f"{salt}:{digest}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return round(10 * value - 5, 4)


def scores(cfg, template: dict, digest: str, salt: str) -> dict:
    main = (template.get(salt) or {}).get("main")
    base = 50.0 if main is None else float(main)
    values = {metric: round(min(100.0, max(-100.0, base + offset(digest, f"{salt}:{metric}"))), 4)
              for metric in cfg.task.metrics}
    return {**values, "main": values[cfg.task.main_metric]}


def clone(cfg, template: dict) -> dict:
    """The record peltbench would write for `cfg` (a run's config, less its `hydra` node, as the task function has it),
    its measurements the template's."""
    from peltbench.record import config_hash
    from peltbench.runner import _identity

    digest = config_hash(cfg)
    record = _identity(cfg, digest)
    record.update({key: template[key] for key in MEASURED if key in template})
    gated = bool(cfg.method.get("gated")) and isinstance(template.get("gates"), dict)  # UniPELT's gates, per layer
    record.update(status="ok", error=None, test=scores(cfg, template, digest, "test"),
                  dev_best=scores(cfg, template, digest, "dev_best"), fused=None, saved=[],
                  gates=template["gates"] if gated else None, finished_at=record["started_at"])
    return record


def work(args: tuple) -> int:
    """Write the records of every `workers`-th run of the grid, from run `index` on."""
    index, workers, out, folder, arguments = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from peltbench import runner
    from peltbench.launchers import register_launchers

    register_launchers()
    known, versions = runner.versions(), runner.versions
    runner.versions = lambda: known  # the same for every record (it reads package metadata: 10 ms a call)
    try:
        return _write(index, workers, out, folder, arguments)
    finally:
        runner.versions = versions


def _write(index: int, workers: int, out: Path, folder: Path, arguments: list) -> int:
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from peltbench.missing import _Composer, expand
    from peltbench.overrides import pin_group_settings
    from peltbench.record import Plain, _dumps, format_record, record_path

    records = templates(folder)
    splits: dict[int, str] = {}
    written = 0
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        pinned = pin_group_settings(["-m", *arguments])[1:]
        sweep_config = loader.load_configuration(config_name="config", overrides=pinned, run_mode=RunMode.MULTIRUN)
        jobs, _ = expand(loader, sweep_config)
        compose = _Composer(loader, sweep_config)
        done = set()
        if out.is_dir():  # an interrupted generation goes on: the runs whose record is there are kept
            done = {num for num in range(index, len(jobs), workers) if record_path(compose(list(jobs[num]), num), out).is_file()}
        for num in range(index, len(jobs), workers):
            if num in done:
                continue
            cfg = compose(list(jobs[num]), num)
            cfg = Plain({key: value for key, value in cfg.items() if key != "hydra"})  # as the task function has it
            template = pick(records, cfg.method.name, cfg.task.name)
            record = clone(cfg, template)
            # format_record visits each split index (2,000 at k = 1000): the template's split is formatted once
            split = record.pop("split", None)
            text = format_record({**record, "split": SPLIT} if split is not None else record)
            if split is not None:
                text = text.replace(json.dumps(SPLIT), splits.setdefault(id(template), _dumps(split, 2)))
            path = record_path(cfg, out)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the results dir to write the records under")
    parser.add_argument("templates", type=Path, help="a directory of real records (result.json) to clone")
    parser.add_argument("sweep", nargs="+", help="the sweep's arguments, as peltbench-missing takes them")
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args()
    out = options.out.expanduser().absolute()
    arguments = [*options.sweep, f"results_dir={out}"]
    started = time.monotonic()
    jobs = [(i, options.workers, out, options.templates, arguments) for i in range(options.workers)]
    if options.workers == 1:
        written = work(jobs[0])
    else:
        with multiprocessing.get_context("spawn").Pool(options.workers) as pool:
            written = sum(pool.map(work, jobs))
    print(f"generate_records: {written} records under {out} in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
