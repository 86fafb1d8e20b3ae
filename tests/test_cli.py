"""The `peltbench` command end to end, as a user runs it, in a temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_glue

PELTBENCH = str(Path(sys.executable).with_name("peltbench"))


def peltbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([PELTBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def workdir(tmp_path, tiny_checkpoint):
    write_glue(tmp_path / "glue")
    shutil.copytree(tiny_checkpoint, tmp_path / "tiny-bert")
    return tmp_path


def common(workdir: Path) -> list[str]:
    return ["model.name=tiny-bert", "data.dir=glue", "k=16", "dev_size=20", "train.epochs=2"]


def records(workdir: Path) -> list[Path]:
    return sorted((workdir / "results").rglob("result.json"))


def test_run_skip_and_a_different_config(workdir):
    run = peltbench("method=unipelt_apl", "task=mrpc", "seed=222", *common(workdir), cwd=workdir)
    assert run.returncode == 0, run.stderr
    assert "epoch 1/2" in run.stderr + run.stdout and "dev f1" in run.stderr + run.stdout
    [path] = records(workdir)
    assert path.relative_to(workdir) == Path(
        "results/runs/unipelt_apl,dev_size=20,model.name=tiny-bert,train.epochs=2/mrpc/k16/seed222/result.json"
    )
    record = json.loads(path.read_text())
    for field in ("method", "task", "k", "seed", "status", "test", "dev_best", "best_epoch", "epochs_run",
                  "trainable_params", "train_seconds", "eval_seconds", "split", "config", "config_hash", "versions"):
        assert field in record, field
    assert (record["method"], record["task"], record["k"], record["seed"], record["status"]) == ("unipelt_apl", "mrpc", 16, 222, "ok")
    assert set(record["test"]) == {"f1", "accuracy", "main"} and record["test"]["main"] == record["test"]["f1"]
    permutation = np.random.default_rng(222).permutation(60).tolist()
    assert record["split"] == {"train_indices": permutation[:16], "dev_indices": permutation[16:36]}
    assert record["versions"]["torch"] and record["config"]["method"]["gated"] is True

    before = path.read_text()
    again = peltbench("method=unipelt_apl", "task=mrpc", "seed=222", *common(workdir), cwd=workdir)
    assert again.returncode == 0 and "skip:" in again.stderr + again.stdout and "epoch 1/2" not in again.stderr + again.stdout
    assert path.read_text() == before

    other = peltbench("method=unipelt_apl", "task=mrpc", "seed=222", "method.bottleneck=8", *common(workdir), cwd=workdir)
    assert other.returncode == 0, other.stderr
    assert len(records(workdir)) == 2 and path.read_text() == before
    assert any("bottleneck=8" in str(p) for p in records(workdir))


def _fails(result: subprocess.CompletedProcess, *fragments: str) -> str:
    output = result.stderr + result.stdout
    assert result.returncode != 0, output
    for fragment in fragments:
        assert fragment in output, output
    assert "Traceback" not in output, output
    return output


def test_bad_inputs_are_one_line_and_write_no_record(workdir):
    _fails(peltbench("method=adaptr", "task=rte", cwd=workdir), "Could not find 'method/adaptr'", "unipelt_apl")
    _fails(peltbench("method=adapter", "task=wnli", cwd=workdir), "Could not find 'task/wnli'", "qnli")
    _fails(peltbench("method=adapter", "task=rte", *common(workdir), "k=50", cwd=workdir),
           "k=50 is too large: the train split has 60 rows and k + dev_size (50 + 20)")
    (workdir / "glue" / "RTE" / "dev.tsv").unlink()
    _fails(peltbench("method=adapter", "task=rte", *common(workdir), cwd=workdir),
           f"data file not found: {workdir}/glue/RTE/dev.tsv")
    gpt = workdir / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    _fails(peltbench("method=adapter", "task=cola", *common(workdir), "model.name=gpt", cwd=workdir),
           "model.name=gpt is not a BERT checkpoint: its config says model_type 'gpt2'")
    _fails(peltbench("method=adapter", "task=cola", *common(workdir), "model.name=nowhere/", cwd=workdir),
           "could not load model 'nowhere/'")
    cola = workdir / "glue" / "CoLA" / "train.tsv"
    lines = cola.read_text().splitlines()
    lines[6] = lines[6].replace("\t", " ", 1)
    cola.write_text("\n".join(lines) + "\n")
    _fails(peltbench("method=adapter", "task=cola", *common(workdir), cwd=workdir),
           f"malformed row in {cola}, line 7: expected 4 tab-separated fields, found 3")
    assert records(workdir) == []


def test_help_lists_methods_and_tasks(workdir):
    result = peltbench("--help", cwd=workdir)
    assert result.returncode == 0
    assert "unipelt_apl_nogate" in result.stdout and "qqp" in result.stdout
