"""Does a busy CPU slow training down? Seconds per training step of LoRA on MiniLM under `protocol=lmbff` (SST-2, K = 16
per class, batch 8) under each way torch's OpenMP threads can wait: torch's defaults (torch imported before peltbench:
its threads spin 300,000 rounds), peltbench's (GOMP_SPINCOUNT=1000, set on import where the user set none),
OMP_WAIT_POLICY=PASSIVE (sleep at once), OMP_NUM_THREADS=1 and shorter or longer spins (`--spin`); on the machine as it
is ("idle") and with busy loops of our own beside it (`--busy 2,4`: two, then four), each setting in a fresh process,
the settings taking turns within a round and the rounds alternating the order of settings and loads. On a machine
others use, `--nice -20` (root) runs our processes, the busy loops included, ahead of theirs: then "idle" is as on an
idle machine.

    python scripts/benchmark_threads.py                  # 2 rounds, 2 busy loops, 3 timed steps per process
    python scripts/benchmark_threads.py --rounds 4 --steps 8 --nice -20 --busy 2,4 --only "torch's defaults,\
        peltbench's defaults,OMP_WAIT_POLICY=PASSIVE,OMP_NUM_THREADS=1,GOMP_SPINCOUNT=2000" --spin 2000  # README's

Prints each process's mean step seconds and, per setting and load, the median over rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {  # name -> (environment added, import torch before peltbench)
    "torch's defaults": ({}, True),
    "peltbench's defaults": ({}, False),                              # GOMP_SPINCOUNT=1000 unless the user set one
    "OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, True),
    "OMP_NUM_THREADS=1": ({"OMP_NUM_THREADS": "1"}, False),
}  # and GOMP_SPINCOUNT=<count> for each of --spin's counts (torch's no-policy default spins 300,000)


def child(torch_first: bool, steps: int) -> None:
    """One process: build the run's group as peltbench does, time `steps` training steps, print their mean."""
    if torch_first:
        import torch  # noqa: F401 - its OpenMP runtime reads the environment now, before peltbench can set it
    import peltbench  # noqa: F401

    sys.path.insert(0, str(REPO / "scripts"))
    from benchmark_fused import _minilm, step_seconds
    from hydra import compose, initialize_config_module

    import torch

    from peltbench.model import load_tokenizer
    from peltbench.tasks import TaskSpec

    model = _minilm()
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "protocol=lmbff", "method=lora", "task=sst2", f"model.name={model}", f"data.dir={REPO / 'data' / 'glue'}",
            "device=cpu", "results_dir=/tmp/peltbench-benchmark"])
    task, tokenizer = TaskSpec.from_config(cfg.task), load_tokenizer(model)
    wall, _, _ = step_seconds([cfg], task, tokenizer, torch.device("cpu"), False, steps)
    print(wall / steps)


def measure(name: str, steps: int, nice: int) -> float:
    extra, torch_first = SETTINGS[name]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_", "GOMP_", "KMP_"))}
    env.update(extra, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    out = subprocess.run([sys.executable, __file__, "--child", "torch" if torch_first else "peltbench",
                          "--steps", str(steps)], env=env, capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.nice(nice))
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy", default="2", help="busy loops per loaded case (2,4: two cases)")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per process")
    parser.add_argument("--nice", type=int, default=0, help="niceness of our processes (-20: ahead of the machine's)")
    parser.add_argument("--spin", default="10000,100000", help="GOMP_SPINCOUNT values to measure, comma-separated")
    parser.add_argument("--only", default="", help="measure only these settings (names as printed, comma-separated)")
    parser.add_argument("--child", choices=["torch", "peltbench"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child == "torch", args.steps)
    for count in filter(None, args.spin.split(",")):
        SETTINGS[f"GOMP_SPINCOUNT={count}"] = ({"GOMP_SPINCOUNT": count}, True)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    for name in [name for name in SETTINGS if only and name not in only]:
        del SETTINGS[name]
    results: dict[tuple[str, str], list[float]] = {}
    loads = {"idle": 0, **{f"{count} busy": count for count in map(int, filter(None, args.busy.split(",")))}}
    for round in range(args.rounds):
        for load in (list(loads) if round % 2 == 0 else list(reversed(loads))):
            busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"], preexec_fn=lambda: os.nice(args.nice))
                    for _ in range(loads[load])]
            try:
                for name in (SETTINGS if round % 2 == 0 else reversed(SETTINGS)):
                    started = time.monotonic()
                    seconds = measure(name, args.steps, args.nice)
                    results.setdefault((name, load), []).append(seconds)
                    print(f"round {round + 1} {load:<6} {name:<23} {seconds:7.3f} s/step  (load average "
                          f"{os.getloadavg()[0]:.1f}, process {time.monotonic() - started:.0f} s)", flush=True)
            finally:
                for process in busy:
                    process.kill()
                    process.wait()
    print("median s/step over rounds:")
    order = {key: index for index, key in enumerate((name, load) for load in loads for name in SETTINGS)}
    for (name, load), seconds in sorted(results.items(), key=lambda item: order[item[0]]):
        print(f"  {load:<6} {name:<23} {statistics.median(seconds):7.3f}")


if __name__ == "__main__":
    main()
