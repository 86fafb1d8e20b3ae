"""scripts/check_gpu.py (make check-gpu): its CPU path, and the comparisons and table its CUDA path prints."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import check_gpu  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the checks instead")
def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    result = subprocess.run(["make", "-s", "check-gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [result.stdout.strip()]
    assert result.stdout.startswith("check-gpu: no CUDA device here (torch ") and result.stderr == ""


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
    from types import SimpleNamespace

    import peltbench.runner

    def majority_rate_run(cfgs):
        return [SimpleNamespace(status="ok", error=None, record={"test": {"main": 50.92}, "precision": "fp32"})]

    monkeypatch.setattr(peltbench.runner, "run_group", majority_rate_run)
    args = SimpleNamespace(out=tmp_path, k=500, epochs=5)
    row = check_gpu.check_precision(args, torch.device("cpu"))
    assert row.ok is False and "fp32 50.92" in row.note and "majority class 50.92" in row.note
    assert row.details[-1] == "a run did not learn: every score must be at least 65.92"
