"""How long peltbench-tables, peltbench-missing and a sweep's start take over many records (docs/tables.md, "How long
it takes"): CPU seconds, wall seconds and peak memory of each, at the sizes asked for.

    python scripts/benchmark_records.py                      # N = 1,200, 9,600 and 100,800 records, both grids
    python scripts/benchmark_records.py --grids seeds --sizes 100200
    python scripts/benchmark_records.py --sizes 1200 --old /work/wt-base/.venv/bin   # also another install's commands

Two grids (--grids): `table1`, a Table-1 grid (10 methods × 8 tasks × K = 100, 500, 1000 × 5 seeds) times L learning
rates (L = 1, 8, 84); and `seeds`, few of each but many seeds (3 methods × 5 tasks × 4 K × 5 learning rates × S seeds,
S = size / 300: 334 for 100,200), where what is worked out once per distinct method, task, K or learning rate repeats
little. Written once under --dir by scripts/generate_records.py from the real MiniLM records of
tests/data/tables/minilm_runs, and kept there for later runs. Measured, each in a process of its own (CPU = user +
system seconds of the process and its children, peak = its largest resident set):

- tables:  `peltbench-tables --results-dir DIR --out OUT`, and again with `--select method.lr`
- missing: `peltbench-missing GRID results_dir=DIR` (every run done)
- start:   what `peltbench -m GRID results_dir=DIR` does before its first run (sweep_start below: preflight and the
           launcher's plan over all the sweep's runs, as peltbench/cli.py and the local launcher compose and check them)
- rerun:   the whole `peltbench -m GRID results_dir=DIR` with every run done (a finished sweep run again: its start,
           the runs it skips, its summary)

A sweep's start reads each task's data before its first run (issue 46), so `start` and `rerun` get `data.dir=` a
folder under --dir: the GLUE files --glue holds (default ../shared/data/glue, else the repository's data/glue), and for
a task whose files are not there a stand-in of 2,200 rows in its task file's layout (its first `files` entry), which
the start reads and checks as it would the real ones: their reading is a small share of a start over 100,000 runs.

--old BIN runs the same commands from another install's bin folder (e.g. an older peltbench's), on the same records,
alternating with this one's, so the two are measured under the same load; with --together the two sides of each
command start at once, one per core (swapped from one command to the next): a machine whose speed changes within the
hour (this one's did by up to 2x) then runs both at the same speed, though each takes more than alone (they share
memory and the page cache). Nothing here asserts a time: timings on a
shared machine are noisy; compare the ratios of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "tests" / "data" / "tables" / "minilm_runs"
METHODS = "ft,bitfit,adapter,prefix,lora,unipelt_ap,unipelt_apl,ln,mam,dora"
TASKS = "sst2,mrpc,cola,rte,qnli,stsb,mnli,qqp"
RATES = ["2e-5", "1e-4", "2e-4", "5e-4", "1e-3", "3e-4", "5e-5", "2e-3"]  # the methods' defaults first
MORE = [f"{m}e-{e}" for e in range(1, 8) for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)]
ALL_RATES = RATES + [rate for rate in MORE if float(rate) not in map(float, RATES)]  # 84 distinct values


# The many-seeds grid: few methods, tasks, K and learning rates, each with many data seeds (seed=1,...,S), so that
# what is worked out once per distinct method, task, K or learning rate repeats little: 300 records per seed.
SEEDS_GRID = ["method=lora,adapter,bitfit", "task=rte,mrpc,cola,sst2,stsb", "k=100,200,500,1000",
              "method.lr=1e-4,2e-4,5e-4,1e-3,2e-3"]
GRIDS = ("table1", "seeds")


def grid(size: int, shape: str = "table1") -> list[str]:
    """The sweep's arguments for about `size` records: the Table-1 grid (`table1`, 1,200 per learning rate) or the
    many-seeds grid (`seeds`, 300 per seed)."""
    if shape == "seeds":
        return SEEDS_GRID + [f"seed={','.join(str(seed) for seed in range(1, max(1, round(size / 300)) + 1))}"]
    rates = max(1, round(size / 1200))
    lrs = ALL_RATES[:rates]
    arguments = [f"method={METHODS}", f"task={TASKS}", "k=100,500,1000", "seed=111,222,333,444,555"]
    return arguments + ([f"method.lr={','.join(lrs)}"] if rates > 1 else [])


def measured(command: list[str], env: dict, core: int | None = None) -> dict:
    """CPU s, wall s and peak RSS (MB) of `command`, run in a process of its own (a fresh wrapper: its children's
    rusage is that command's alone); `core`: on that CPU alone."""
    return _result(_measuring(command, env, core))


PROBE = ("import json, os, resource, subprocess, sys, time\n"
         "if sys.argv[1] != '-': os.sched_setaffinity(0, {int(sys.argv[1])})\n"
         "start = time.perf_counter()\n"
         "done = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
         "wall = time.perf_counter() - start\n"
         "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
         "print(json.dumps({'rc': done.returncode, 'cpu': usage.ru_utime + usage.ru_stime, 'wall': wall,\n"
         "                  'peak_mb': usage.ru_maxrss / 1024, 'stderr': done.stderr[-2000:]}))\n")


def _measuring(command: list[str], env: dict, core: int | None = None) -> subprocess.Popen:
    """`command` started under the probe (`measured`), on CPU `core` alone where given."""
    return subprocess.Popen([sys.executable, "-c", PROBE, "-" if core is None else str(core), *command],
                            stdout=subprocess.PIPE, text=True, env=env)


def _result(process: subprocess.Popen) -> dict:
    return json.loads(process.communicate()[0])


def sweep_start(arguments: list[str]) -> None:
    """What `peltbench -m ARGUMENTS` does before it runs anything, over every run at once: peltbench's preflight (each
    run's config composed and checked) and the local launcher's plan of the whole sweep (configs, fused groups, each
    record's state: hydra_plugins/peltbench_local/_launcher.py plan_sweep). An install from before the plan (--old):
    its launcher's steps over all runs (configs, groups, states)."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from peltbench.cli import preflight
    from peltbench.launchers import register_launchers
    from peltbench.missing import compose_jobs, expand, record_states
    from peltbench.overrides import pin_group_settings

    register_launchers()
    pinned = pin_group_settings(["-m", *arguments])
    preflight(pinned)
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration(config_name="config", overrides=pinned[1:], run_mode=RunMode.MULTIRUN)
        jobs, _ = expand(loader, config)
        runs = [(list(job), num) for num, job in enumerate(jobs)]
        try:
            from hydra_plugins.peltbench_local._launcher import plan_sweep
        except ImportError:
            from hydra_plugins.peltbench_local._launcher import group_packs

            cfgs = compose_jobs(loader, config, [job for job, _ in runs])
            group_packs(runs, cfgs)
            states = record_states(cfgs)
        else:
            states = list(plan_sweep(loader, config, runs).states.values())
    print(f"{len(states)} runs: {sum(state == 'done' for state in states)} done", file=sys.stderr)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sweep-start":
        sweep_start(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1200,9600,100800", help="records, comma-separated (1,200 per learning rate)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/peltbench-benchmark"), help="where the records go")
    parser.add_argument("--old", type=Path, help="another install's bin folder, measured alike (its own python)")
    parser.add_argument("--grids", default=",".join(GRIDS), help="which grids: table1 (its own), seeds (many seeds)")
    parser.add_argument("--skip", default="", help="what not to measure: tables,select,missing,start,rerun")
    parser.add_argument("--together", action="store_true",
                        help="with --old: start both sides of each command at once, one per core (their cores swapped "
                             "from one command to the next), so the machine's speed is the same for both")
    parser.add_argument("--glue", type=Path, default=next((path for path in (REPO.parent / "shared" / "data" / "glue",
                                                                          REPO / "data" / "glue") if path.is_dir()), None),
                        help="a GLUE folder for the start's data (tasks it lacks get stand-ins)")
    options = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    here = Path(sys.executable).parent
    sides = [("new", here)] + ([("old", options.old)] if options.old else [])
    skip = set(filter(None, options.skip.split(",")))
    for shape in options.grids.split(","):
        for size in map(int, options.sizes.split(",")):
            measure(shape, size, options, sides, skip, env)


def stand_in_glue(folder: Path, glue: Path | None) -> Path:
    """`folder` as a GLUE data dir for every packaged GLUE task: `glue`'s own task folders linked, and for each task
    whose train file is not there, stand-in train and test files of 2,200 rows in the layout its task file's first
    `files` entry names (columns, header, label names or numbers)."""
    import csv

    from omegaconf import OmegaConf

    folder.mkdir(parents=True, exist_ok=True)
    for task_file in sorted((REPO / "conf" / "task").glob("*.yaml")):
        task = OmegaConf.load(task_file)
        entry = task.files[0] if OmegaConf.is_list(task.files) else task.files
        text, label = list(entry.get("text", task.text)), entry.get("label", task.label)
        top = Path(entry.train).parts[0]
        if glue is not None and all((glue / entry[split]).is_file() for split in ("train", "test")):
            if not (folder / top).exists():
                (folder / top).symlink_to((glue / top).resolve())
            continue
        for split in ("train", "test"):
            target = folder / entry[split]
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            header = entry.get("header", True)
            columns = max([*text, label]) + 1 if not header else None
            with open(target, "w", newline="") as out:
                writer = csv.writer(out, delimiter="\t")
                if header:
                    writer.writerow([*text, label])
                for row in range(2200):
                    value = (f"{(row % 50) / 10:.1f}" if task.num_labels == 1 else
                             task.label_names[row % task.num_labels] if task.label_names else row % task.num_labels)
                    sentences = [f"stand-in sentence {row} of part {part}" for part in range(len(text))]
                    if header:
                        writer.writerow([*sentences, value])
                    else:
                        cells = [""] * columns
                        for index, sentence in zip(text, sentences):
                            cells[index] = sentence
                        cells[label] = value
                        writer.writerow(cells)
    return folder


def measure(shape: str, size: int, options: argparse.Namespace, sides: list, skip: set, env: dict) -> None:
    """Each command on the records of grid `shape` at `size`, for each side, one line each."""
    arguments = grid(size, shape)
    data = stand_in_glue(options.dir / "glue", options.glue)
    runs = options.dir / (f"runs{size}" if shape == "table1" else f"{shape}{size}")
    if not runs.is_dir():
        print(f"generating {size} records under {runs} ...", flush=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "generate_records.py"), str(runs), str(TEMPLATES),
                        *arguments], check=True, env=env)
    commands = {name: _commands(bin_dir, arguments, runs, data, options.dir / f"tables{shape}{size}-{name}",
                                options.dir, name) for name, bin_dir in sides}
    for number, what in enumerate(commands[sides[0][0]]):
        if what in skip:
            continue
        if options.together and len(sides) > 1:
            cores = [(index + number) % len(sides) for index in range(len(sides))]
            running = [_measuring(commands[name][what], env, core) for (name, _), core in zip(sides, cores)]
            results = [_result(process) for process in running]
        else:
            results = [measured(commands[name][what], env) for name, _ in sides]
        for (name, _), result in zip(sides, results):
            line = (f"{shape:<6} N={size:>7,} {name:<3} {what:<7} rc {result['rc']}  CPU {result['cpu']:7.1f} s  "
                    f"wall {result['wall']:7.1f} s  peak {result['peak_mb']:6.0f} MB")
            print(line, flush=True)
            if result["rc"] not in (0,):
                print("   " + result["stderr"].strip().replace("\n", "\n   "), flush=True)
        for name, _ in sides:
            shutil.rmtree(options.dir / f"sweep-rerun-{name}", ignore_errors=True)
            shutil.rmtree(options.dir / f"sweep-{name}", ignore_errors=True)


def _commands(bin_dir: Path, arguments: list[str], runs: Path, data: Path, out: Path, work: Path, name: str) -> dict:
    """Each measured command of one side (`name`, its bin folder), in the order measured."""
    return {
        "tables": [str(bin_dir / "peltbench-tables"), "--results-dir", str(runs), "--out", str(out)],
        "select": [str(bin_dir / "peltbench-tables"), "--results-dir", str(runs), "--out", f"{out}-select",
                   "--select", "method.lr"],
        "missing": [str(bin_dir / "peltbench-missing"), *arguments, f"results_dir={runs}"],
        "start": [str(bin_dir / "python"), str(Path(__file__).resolve()), "--sweep-start", *arguments,
                  f"results_dir={runs}", f"data.dir={data}", f"hydra.sweep.dir={work / f'sweep-{name}'}"],
        "rerun": [str(bin_dir / "peltbench"), "-m", *arguments, f"results_dir={runs}", f"data.dir={data}",
                  f"hydra.sweep.dir={work / f'sweep-rerun-{name}'}"],
    }


if __name__ == "__main__":
    main()
