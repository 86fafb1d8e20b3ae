"""fp32 vs bf16 autocast on one device (issue 15, item 9): training, dev evaluation and test pass, alternating.

In one process, in alternating turns (fp32 first in odd rounds, bf16 first in even ones), the same run trains
with peltbench's own loop (`train.fit`, one epoch by default: the steps of an epoch, one dev evaluation and the
test pass), real GLUE rows and a real checkpoint, once in each precision, on a fresh copy of the model. Printed:
each precision's median wall seconds for the training steps, the dev evaluation, the test pass and all three, and
the process's CPU seconds (all threads; on a shared machine the steadier measure, with --threads 1), with
bf16/fp32 (below 1: bf16 is faster); then, from one extra untimed pass of each, the aten operators dispatched
and the dtype casts among them per sequence; and a GEMM of the model's FFN shape in fp32 and bf16 (alternating,
median), which says what bf16 can gain on this device at best.

    python scripts/benchmark_precision.py                       # LoRA, SST-2, K=100, MiniLM, CPU
    python scripts/benchmark_precision.py --method unipelt_apl --rounds 7 --threads 2
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from benchmark_fused import OperatorCount, _minilm, check_inputs, configs

from peltbench.model import load_config, load_tokenizer
from peltbench.runner import group_model, group_settings, prepare_member
from peltbench.tasks import TaskSpec
from peltbench.train import fit

PHASES = ("train", "dev", "test")  # wall seconds of each, as the record reports them


def run(cfg, task, tokenizer, device, bf16) -> dict[str, float]:
    """One run trained with peltbench's loop in one precision (bf16 too on a CPU, where `peltbench` refuses it):
    seconds of its training steps, dev evaluations and test pass."""
    member = prepare_member(cfg, task, tokenizer, "run")[0]
    model = group_model([cfg], task, device)
    settings = group_settings(cfg, model, tokenizer.pad_token_id, device, bf16)
    done = {}
    cpu = time.process_time()
    fit(model, [member], task, settings, lambda _, result: done.update(result=result))
    cpu = time.process_time() - cpu
    result = done["result"]
    return {"train": result.train_seconds, "dev": result.eval_seconds - result.test_seconds,
            "test": result.test_seconds, "cpu": cpu}


def gemm(args, config_, device) -> dict[str, float]:
    """Seconds of (batch·length, hidden) x (hidden, intermediate), the FFN's GEMM, as F.linear in each dtype."""
    rows = args.gemm_rows
    x = torch.randn(rows, config_.hidden_size, device=device)
    weight = torch.randn(config_.intermediate_size, config_.hidden_size, device=device)
    sides = {"fp32": (x, weight), "bf16": (x.bfloat16(), weight.bfloat16())}
    times: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(3 + 2 * args.rounds):
        for side in (("fp32", "bf16") if round_ % 2 == 0 else ("bf16", "fp32")):
            a, b = sides[side]
            start = time.perf_counter()
            for _ in range(5):
                torch.nn.functional.linear(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if round_ >= 3:
                times[side].append((time.perf_counter() - start) / 5)
    return {side: statistics.median(values) for side, values in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=_minilm(), help="checkpoint (default: the MiniLM test package's)")
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"),
                        help="a local GLUE directory (default ../shared/data/glue)")
    parser.add_argument("--method", default="lora")
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5, help="timed turns of each precision (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--gemm-rows", type=int, default=16 * 40,
                        help="rows of the GEMM probe (default: a training step's tokens)")
    args = parser.parse_args(argv)
    check_inputs(args, "benchmark_precision")
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    cfg = configs(args, [(args.method, args.k, 111)])[0]
    device = torch.device(args.device)
    task, tokenizer = TaskSpec.from_config(cfg.task), load_tokenizer(cfg.model.name)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else _cpu_name()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}), {args.method}, {args.task}, K={args.k}, "
          f"model {args.model}, {args.epochs} epoch(s) per turn, {args.rounds} alternating rounds", flush=True)
    sides = {"fp32": False, "bf16": True}
    for bf16 in sides.values():  # warm-up: tokenisation, the model load, allocator, kernels
        run(cfg, task, tokenizer, device, bf16)
    times: dict[str, dict[str, list[float]]] = {side: {phase: [] for phase in (*PHASES, "cpu")} for side in sides}
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
        for side in order:
            seconds = run(cfg, task, tokenizer, device, sides[side])
            for phase in (*PHASES, "cpu"):
                times[side][phase].append(seconds[phase])
        print(f"  round {round_ + 1}: " + "   ".join(
            f"{side} " + " ".join(f"{phase} {times[side][phase][-1]:.1f}" for phase in PHASES) for side in sides),
            flush=True)
    print(f"{'phase':<8}{'fp32 s':>9}{'bf16 s':>9}{'bf16/fp32':>11}   (medians over {args.rounds} rounds)")
    for phase in (*PHASES, "total", "cpu"):
        medians = {side: statistics.median([sum(times[side][p][i] for p in PHASES) for i in range(args.rounds)])
                   if phase == "total" else statistics.median(times[side][phase]) for side in sides}
        print(f"{phase:<8}{medians['fp32']:>9.2f}{medians['bf16']:>9.2f}{medians['bf16'] / medians['fp32']:>11.2f}")
    member = prepare_member(cfg, task, tokenizer, "run")[0]
    sequences = args.epochs * (len(member.train) + len(member.dev)) + len(member.test)
    for side, bf16 in sides.items():
        with OperatorCount() as counter:
            run(cfg, task, tokenizer, device, bf16)
        print(f"{side}: {counter.count / sequences:.1f} aten operators per sequence, {counter.casts / sequences:.2f} "
              f"dtype casts")
    shape = load_config(cfg.model.name, task.num_labels)
    seconds = gemm(args, shape, device)
    flops = 2 * args.gemm_rows * shape.hidden_size * shape.intermediate_size
    print(f"GEMM {args.gemm_rows}x{shape.hidden_size} @ {shape.hidden_size}x{shape.intermediate_size}: "
          f"fp32 {flops / seconds['fp32'] / 1e9:.0f} GFLOP/s, bf16 {flops / seconds['bf16'] / 1e9:.0f} GFLOP/s, "
          f"bf16/fp32 time {seconds['bf16'] / seconds['fp32']:.2f}")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


if __name__ == "__main__":
    main()
