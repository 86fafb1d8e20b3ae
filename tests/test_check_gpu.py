"""scripts/check_gpu.py (make check-gpu): its CPU path, and the comparisons and table its CUDA path prints.

What these caught on main at cadcef0 (issue 40): without CUDA it exited 0; the methods check passed runs in fp32 on
CUDA; the tests check passed when every device test skipped; Ctrl-C or SystemExit inside a check ended the script
with no table written; the benchmark passed with fused slower than separate; nothing failed with the precision
check's 2-point rule taken out. On main at 99645ad (issue 48): the tests check passed with PYTEST_ADDOPTS="-k ia3"
(1 of the device tests run) and with the other files' tests skipped (test_saving.py's importorskip("peft")).
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import check_gpu  # noqa: E402


NO_CUDA = "check-gpu: no CUDA device here (torch "


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the checks instead")
def test_without_cuda_it_says_so_in_one_line_and_fails():
    """`make check-gpu && sbatch ...` must not go on where torch sees no GPU: nothing was checked."""
    result = subprocess.run(["make", "-s", "check-gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and result.stdout == ""
    line, *make = result.stderr.splitlines()
    assert line.startswith(NO_CUDA) and line.endswith("nothing checked, so no pass (--device cpu runs the steps on "
                                                      "the CPU as a dry run)")
    assert all(extra.startswith("make") for extra in make)  # make's own "Error 1"


def test_without_cuda_only_the_cpu_dry_run_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(check_gpu, "check_fused", lambda args, device: check_gpu.Row("fused", True))
    table = tmp_path / "table.txt"
    for device in ([], ["--device", "cuda"], ["--device", "cuda:1"]):
        assert check_gpu.main([*device, "--table", str(table)]) == 1
        assert capsys.readouterr().err.startswith(NO_CUDA) and not table.exists()
    assert check_gpu.main(["--device", "cpu", "--only", "fused", "--table", str(table)]) == 0
    assert table.read_text().splitlines()[2].split()[:2] == ["fused", "ok"]


def record(best_epoch=3, main=85.0, losses=(0.69, 0.41, 0.30), status="ok"):
    return {"status": status, "best_epoch": best_epoch, "test": {"main": main},
            "history": [{"epoch": i + 1, "train_loss": loss} for i, loss in enumerate(losses)]}


def test_a_fused_record_must_equal_its_separate_one_to_rounding():
    assert check_gpu.compare_records(record(), record(main=85.0 + 1e-4, losses=(0.69, 0.41, 0.30000001))) is None
    assert check_gpu.compare_records(record(), record(best_epoch=2)) == "best epoch 3 alone, 2 fused"
    assert check_gpu.compare_records(record(), record(main=84.0)) == "test 85.00 alone, 84.00 fused"
    assert check_gpu.compare_records(record(), record(losses=(0.69, 0.42, 0.30))) == \
        "epoch 2 train loss 0.410000 alone, 0.420000 fused"
    assert check_gpu.compare_records(record(), record(status="failed")) == "status ok alone, failed fused"


def test_the_table_has_a_row_per_check_and_the_details_below():
    rows = [check_gpu.Row("tests", True, 61.04, note="212 passed in 61.0s"),
            check_gpu.Row("fused", False, 30.0, 0.4, peak="1.20 GiB / 1.50 GiB", details=["lora: best epoch 3 alone, 2 fused"]),
            check_gpu.Row("benchmark", None, note="not run")]
    lines = check_gpu.table(rows).splitlines()
    assert lines[0].split() == ["check", "result", "wall", "s", "fused/sep", "ops/seq", "sep/fused", "peak", "memory",
                                "note"]
    assert lines[1].split() == ["tests", "ok", "61.0", "212", "passed", "in", "61.0s"]
    assert lines[2].split()[:4] == ["fused", "FAIL", "30.0", "0.40"] and "1.20 GiB / 1.50 GiB" in lines[2]
    assert lines[3].split() == ["benchmark", "skipped", "0.0", "not", "run"]
    assert lines[4] == "  fused: lora: best epoch 3 alone, 2 fused"


def test_a_check_that_fails_is_a_fail_row_and_the_others_still_run(monkeypatch, tmp_path, capsys):
    """The benchmark's exception once ended the script before its table: each check now stands alone."""
    def broken(args, device):
        raise RuntimeError("index_add_(): self (Float) and source (BFloat16) must have the same scalar type\n  more")

    ran = []
    monkeypatch.setattr(check_gpu, "check_tests", broken)
    monkeypatch.setattr(check_gpu, "check_fused", lambda args, device: ran.append("fused") or check_gpu.Row("fused", True))
    table = tmp_path / "table.txt"
    status = check_gpu.main(["--device", "cpu", "--only", "tests", "fused", "--table", str(table)])
    assert status == 1 and ran == ["fused"]
    lines = table.read_text().splitlines()
    assert lines[0].startswith("check-gpu on cpu (CPU: a dry run")
    assert lines[2].split()[:2] == ["tests", "FAIL"]
    assert lines[2].endswith("RuntimeError: index_add_(): self (Float) and source (BFloat16) must have the same scalar type")
    assert lines[3].split()[:2] == ["fused", "ok"]
    assert capsys.readouterr().out.count("RuntimeError: index_add_()") == 2  # as it came, then in the whole table


def test_the_precision_check_fails_a_run_that_did_not_learn(monkeypatch, tmp_path):
    """A run at the majority rate in both precisions (the first GPU run's 50.92 and 50.92) is a FAIL, not 'ok'."""
    import peltbench.runner

    def majority_rate_run(cfgs):
        return [SimpleNamespace(status="ok", error=None, record={"test": {"main": 50.92}, "precision": "fp32"})]

    monkeypatch.setattr(peltbench.runner, "run_group", majority_rate_run)
    args = SimpleNamespace(out=tmp_path, k=500, epochs=5)
    row = check_gpu.check_precision(args, torch.device("cpu"))
    assert row.ok is False and "fp32 50.92" in row.note and "majority class 50.92" in row.note
    assert row.details[-1] == "a run did not learn: every score must be at least 65.92"


def test_the_precision_check_fails_bf16_and_fp32_more_than_2_points_apart(monkeypatch, tmp_path):
    """Both runs learned, 3 points apart: FAIL (the rule taken out, `ok = learned`, would pass it); 1.5 apart: ok."""
    import peltbench.runner

    scores = {}

    def runs(cfgs):
        [cfg] = cfgs
        return [SimpleNamespace(status="ok", error=None, record={"test": {"main": scores[cfg.precision]}})]

    monkeypatch.setattr(peltbench.runner, "run_group", runs)
    monkeypatch.setattr(check_gpu, "_reset", lambda device: None)
    monkeypatch.setattr(check_gpu, "_peak", lambda device: "1.00 GiB")
    args = SimpleNamespace(out=tmp_path, k=500, epochs=5)
    scores.update(bf16=80.0, fp32=83.0)
    row = check_gpu.check_precision(args, torch.device("cuda"))
    assert row.ok is False and row.note.startswith("bf16 80.00, fp32 83.00 (SST-2 accuracy, majority class 50.92")
    assert row.details == ["bf16 and fp32 3.00 points apart (at most 2.0)"]
    scores.update(bf16=80.0, fp32=81.5)
    row = check_gpu.check_precision(args, torch.device("cuda"))
    assert row.ok is True and row.details == []


def fake_runs(precision: str):
    """run_group's stand-in: every run ok in `precision`, a group of several fused as one."""
    def run_group(cfgs):
        fused = {"size": len(cfgs)} if len(cfgs) > 1 else None
        return [SimpleNamespace(status="ok", error=None, record={"test": {"main": 80.0}, "precision": precision,
                                                                 "fused": fused}) for _ in cfgs]
    return run_group


def test_the_methods_check_requires_the_bf16_it_claims(monkeypatch, tmp_path):
    """Every run ok but in fp32 on CUDA (precision=auto not choosing bf16 there): FAIL; in bf16: ok."""
    import peltbench.runner

    monkeypatch.setattr(check_gpu, "_configs", lambda runs, *args, **settings: [m for m, _ in runs])
    monkeypatch.setattr(check_gpu, "_reset", lambda device: None)
    monkeypatch.setattr(check_gpu, "_peak", lambda device: "1.00 GiB")
    args = SimpleNamespace(out=tmp_path)
    monkeypatch.setattr(peltbench.runner, "run_group", fake_runs("fp32"))
    row = check_gpu.check_methods(args, torch.device("cuda"))
    count = len(check_gpu.METHODS) + len(check_gpu.METHODS) - len(check_gpu.ALONE_ONLY)
    assert row.ok is False and row.details == [f"{count} runs not in bf16: adalora (fp32), adapter (fp32), bitfit (fp32), "
                                               "boft (fp32), c3a (fp32), delora (fp32), dora (fp32), fourierft (fp32)"]
    monkeypatch.setattr(peltbench.runner, "run_group", fake_runs("bf16"))
    row = check_gpu.check_methods(args, torch.device("cuda"))
    assert row.ok is True and row.details == [] and ", bf16 (MiniLM" in row.note
    assert check_gpu.check_methods(args, torch.device("cpu")).ok is False  # a CPU's dry run trains in fp32
    monkeypatch.setattr(peltbench.runner, "run_group", fake_runs("fp32"))
    assert check_gpu.check_methods(args, torch.device("cpu")).ok is True


def junit(cases: dict[str, str]) -> str:
    """pytest's --junitxml: node id -> "passed", "skipped" (pytest.skip in the test) or, for a file, "module skipped"
    (an importorskip at its top: pytest writes one case for the module)."""
    rows = []
    for node, result in cases.items():
        path, _, name = node.partition("::")
        module = path[:-3].replace("/", ".")
        if result == "module skipped":
            why = "&quot;Skipped: could not import &apos;peft&apos;: No module named &apos;peft&apos;&quot;"
            rows.append(f'<testcase classname="" name="{module}" time="0.0"><skipped message="collection skipped">'
                        f"(&apos;/repo/{path}&apos;, 3, {why})</skipped></testcase>")
            continue
        skipped = '<skipped type="pytest.skip" message="no GPU">skipped</skipped>' if result == "skipped" else ""
        rows.append(f'<testcase classname="{module}" name="{name}" time="1.0">{skipped}</testcase>')
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">' + "".join(rows)
            + "</testsuite></testsuites>")


A, B = "tests/test_devices.py::test_a[bert]", "tests/test_devices.py::test_b[lora]"
SAVED = "tests/test_saving.py::test_peft_copy"


def test_the_tests_check_requires_every_device_test_to_have_run_on_the_device(monkeypatch, tmp_path):
    """pytest's exit status 0 is not enough: device tests skipped or not run, skips in the other files (a module skipped
    as a whole too), or runs on another device, are a FAIL."""
    scenario = {}

    def pytest_run(command, cwd, capture_output, text, env):
        if "--collect-only" in command:  # the expected list: every test, whatever PYTEST_ADDOPTS deselects
            assert "PYTEST_ADDOPTS" not in env and command[command.index("-o") + 1] == "addopts="
            listed = "".join(f"{node}\n" for node in scenario.get("expected", [A, B, SAVED]))
            return subprocess.CompletedProcess(command, 0, f"{listed}\n3 tests collected in 0.5s\n", "")
        [xml] = [part.split("=", 1)[1] for part in command if part.startswith("--junitxml=")]
        assert env["PELTBENCH_TEST_DEVICE"] == "cuda" and env["PYTEST_ADDOPTS"] == "-k whatever"
        with open(xml, "w") as handle:
            handle.write(junit({SAVED: "passed", **scenario["cases"]}))
        with open(env["PELTBENCH_DEVICE_REPORT"], "w") as handle:
            handle.writelines(f"{node}\t{device}\n" for node, device in scenario["report"].items())
        return subprocess.CompletedProcess(command, scenario.get("status", 0), f"{scenario['summary']}\n", "")

    monkeypatch.setattr(check_gpu.subprocess, "run", pytest_run)
    monkeypatch.setattr(check_gpu, "DEVICE_TESTS", ["tests/test_devices.py", "tests/test_saving.py"])
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k whatever")
    args, cuda = SimpleNamespace(out=tmp_path), torch.device("cuda")
    scenario.update(cases={A: "skipped", B: "skipped"}, report={}, summary="1 passed, 2 skipped in 1.0s")
    row = check_gpu.check_tests(args, cuda)
    assert row.ok is False and row.details == [
        "tests/test_devices.py: 2 of 2 tests skipped: test_a[bert] (no GPU), test_b[lora] (no GPU)"]
    scenario.update(cases={A: "passed", B: "passed"}, summary="3 passed in 1.0s", report={A: "cuda", B: "cpu"})
    row = check_gpu.check_tests(args, cuda)
    assert row.ok is False and row.details == [
        "tests/test_devices.py: 1 tests did not run on cuda alone: test_b[lora] (cpu)"]
    scenario.update(report={A: "cuda"})
    assert check_gpu.check_tests(args, cuda).details == [
        "tests/test_devices.py: 1 tests did not run on cuda alone: test_b[lora] (no report)"]
    scenario.update(cases={}, report={}, summary="1 passed, 2 deselected in 0.1s")
    assert check_gpu.check_tests(args, cuda).details == [
        "tests/test_devices.py: 2 of 2 tests did not run: test_a[bert], test_b[lora]"]
    scenario.update(cases={A: "passed", B: "passed", SAVED: "skipped"}, summary="2 passed, 1 skipped in 1.0s",
                    report={A: "cuda", B: "cuda"})
    assert check_gpu.check_tests(args, cuda).details == [
        "tests/test_saving.py: 1 of 1 tests skipped: test_peft_copy (no GPU)"]
    scenario.update(expected=[A, B], cases={A: "passed", B: "passed", "tests/test_saving.py": "module skipped"})
    assert check_gpu.check_tests(args, cuda).details == [
        "tests/test_saving.py: skipped as a whole (could not import 'peft': No module named 'peft')"]
    scenario.update(cases={A: "passed", B: "passed"}, summary="2 passed in 1.0s")
    assert check_gpu.check_tests(args, cuda).details == ["tests/test_saving.py: no test listed"]
    scenario.update(expected=[A, B, SAVED], summary="3 passed in 1.0s")
    row = check_gpu.check_tests(args, cuda)
    assert row.ok is True and row.note == "3 passed in 1.0s" and row.details == []
    scenario.update(status=1, summary="1 failed, 2 passed in 1.0s")
    assert check_gpu.check_tests(args, cuda).details == ["pytest exited 1: 1 failed, 2 passed in 1.0s"]


DEVICE_TESTS_HERE = """import os
import pytest

@pytest.mark.parametrize("method", ["ia3", "lora", "vera"])
def test_alone(method, request):
    with open(os.environ["PELTBENCH_DEVICE_REPORT"], "a") as report:
        report.write(f"{request.node.nodeid}\\tcpu\\n")
"""
SAVING_HERE = """import os
import pytest

def test_reloaded():
    pass

def test_peft_copy():
    pytest.importorskip(os.environ.get("CHECK_GPU_NEEDS", "json"))
"""


def test_the_tests_check_counts_what_pytest_really_ran(monkeypatch, tmp_path):
    """With real pytest runs: PYTEST_ADDOPTS="-k ia3" runs 1 of the 3 device tests with exit status 0, and an
    importorskip in another file skips its test with exit status 0; both are a FAIL that names them (on main at 99645ad
    the row said ok)."""
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "pytest.ini").write_text("[pytest]\n")
    (repo / "tests" / "test_devices.py").write_text(DEVICE_TESTS_HERE)
    (repo / "tests" / "test_saving.py").write_text(SAVING_HERE)
    monkeypatch.setattr(check_gpu, "REPO", repo)
    monkeypatch.setattr(check_gpu, "DEVICE_TESTS", ["tests/test_devices.py", "tests/test_saving.py"])
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # 0.4 CPU s a pytest run here instead of 1.9
    args, cpu = SimpleNamespace(out=tmp_path), torch.device("cpu")
    row = check_gpu.check_tests(args, cpu)
    assert row.ok is True and row.details == [] and row.note.startswith("5 passed")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k 'ia3 or saving'")
    monkeypatch.setenv("CHECK_GPU_NEEDS", "peft_not_installed")
    row = check_gpu.check_tests(args, cpu)
    assert row.ok is False and row.note.startswith("2 passed, 1 skipped, 2 deselected")
    assert row.details == [
        "tests/test_devices.py: 2 of 3 tests did not run: test_alone[lora], test_alone[vera]",
        "tests/test_saving.py: 1 of 2 tests skipped: test_peft_copy (could not import 'peft_not_installed': No module "
        "named 'peft_not_installed')"]


def test_each_row_is_written_as_it_ends(monkeypatch, tmp_path):
    """A crash (or a kill) in a later check leaves the rows found so far in the table file, which says it is not
    finished."""
    table = tmp_path / "table.txt"
    seen = []
    monkeypatch.setattr(check_gpu, "check_tests", lambda args, device: check_gpu.Row("tests", True, note="77 passed"))
    monkeypatch.setattr(check_gpu, "check_fused",
                        lambda args, device: seen.append(table.read_text()) or check_gpu.Row("fused", True))
    monkeypatch.setattr(check_gpu, "check_benchmark", lambda args, device: check_gpu.Row("benchmark", True))
    assert check_gpu.main(["--device", "cpu", "--only", "tests", "fused", "benchmark", "--table", str(table)]) == 0
    [during] = seen
    lines = during.splitlines()
    assert lines[2].split() == ["tests", "ok", "0.0", "77", "passed"]
    assert lines[-1] == "check-gpu: not finished: fused running, then benchmark"
    assert "not finished" not in table.read_text()


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(2)], ids=["ctrl-c", "SystemExit"])
def test_ctrl_c_or_system_exit_inside_a_check_is_its_fail_row_and_the_table_is_written(stop, monkeypatch, tmp_path):
    """Ctrl-C: a FAIL row saying so, the checks after it not run, exit status 130; SystemExit (pytest's main, a
    CLI's exit inside a check): a FAIL row, and the next check still runs."""
    ran = []

    def stopped(args, device):
        raise stop

    monkeypatch.setattr(check_gpu, "check_tests", stopped)
    monkeypatch.setattr(check_gpu, "check_fused", lambda args, device: ran.append("fused") or check_gpu.Row("fused", True))
    table = tmp_path / "table.txt"
    try:
        status = check_gpu.main(["--device", "cpu", "--only", "tests", "fused", "--table", str(table)])
    except BaseException as error:  # noqa: BLE001 - not this test session's Ctrl-C: the script's
        pytest.fail(f"{type(error).__name__} ended the script (table written: {table.exists()})")
    lines = table.read_text().splitlines()
    assert lines[2].split()[:2] == ["tests", "FAIL"]
    if isinstance(stop, KeyboardInterrupt):
        assert status == 130 and ran == []
        assert lines[2].endswith("interrupted (Ctrl-C): not finished")
        assert lines[3].split() == ["fused", "skipped", "0.0", "not", "run:", "interrupted"]
    else:
        assert status == 1 and ran == ["fused"]
        assert lines[2].endswith("SystemExit(2) inside the check") and lines[3].split()[:2] == ["fused", "ok"]


def test_the_benchmark_fails_when_fused_is_slower_than_separate(monkeypatch, tmp_path):
    """Its steps and the GPU stand in (the configs, tokenizer and a hidden-64 BERT are real); fused slower on a GPU:
    FAIL. A CPU's dry run reports the times without judging them."""
    import benchmark_fused
    import peltbench.runner

    walls, checkpoint = [], check_gpu.bert_base_checkpoint
    monkeypatch.setattr(benchmark_fused, "train", lambda *args, **kwargs: 1)
    monkeypatch.setattr(benchmark_fused, "timed", lambda step, device: walls.pop(0))  # separate, then fused
    monkeypatch.setattr(benchmark_fused, "counted", lambda step, device: (10, 0, 100))
    monkeypatch.setattr(check_gpu, "bert_base_checkpoint", lambda folder, tiny: checkpoint(folder, True))
    monkeypatch.setattr(peltbench.runner, "resolve_device", lambda cfg, training=True: (torch.device("cuda"), True))
    monkeypatch.setattr(check_gpu, "_reset", lambda device: None)
    monkeypatch.setattr(check_gpu, "_peak", lambda device: "1.00 GiB")
    args, cuda = SimpleNamespace(out=tmp_path), torch.device("cuda")
    walls[:] = [2.0, 3.0]
    row = check_gpu.check_benchmark(args, cuda)
    assert row.ok is False and row.ratio == 1.5 and "bf16: separate 2.0 s, fused 3.0 s" in row.note
    assert row.details == ["fused 3.0 s is not faster than the same runs separate (2.0 s)"]
    walls[:] = [3.0, 1.5]
    row = check_gpu.check_benchmark(args, cuda)
    assert row.ok is True and row.ratio == 0.5 and row.details == []
    walls[:] = [2.0, 3.0]
    row = check_gpu.check_benchmark(args, torch.device("cpu"))
    assert row.ok is True and row.note.endswith("fused 3.0 s (speed not judged on a CPU)")
