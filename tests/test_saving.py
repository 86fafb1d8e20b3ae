"""Saved runs: weights.safetensors rebuilds the run (load_run), predictions.csv, the PEFT copy of a LoRA, loggers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import peltbench
from conftest import compose_config, tiny_run_overrides
from peltbench.data import load_split
from peltbench.runner import run_group
from peltbench.tasks import TaskSpec


def configs(checkpoint: Path, glue: Path, results: Path, methods, task="rte", **extra):
    overrides = [*tiny_run_overrides(checkpoint, glue, results), "save.weights=true", "save.predictions=true"]
    overrides += [f"{key}={value}" for key, value in extra.items()]
    return [compose_config(f"method={method}", f"task={task}", *overrides) for method in methods]


def test_a_saved_run_is_rebuilt_and_rescored_exactly(tiny_checkpoint, glue_dir, tmp_path):
    [ln], [adapter] = (run_group([cfg]) for cfg in configs(tiny_checkpoint, glue_dir, tmp_path, ["ln", "adapter"], task="stsb"))
    for outcome in (ln, adapter):
        folder = Path(outcome.record["config"]["results_dir"])
        run_dir = next(folder.glob(f"{outcome.record['variant']}/stsb/k16/seed111"))
        assert outcome.record["saved"] == ["weights.safetensors", "predictions.csv"]
        loaded = peltbench.load_run(run_dir)
        scores, predictions = loaded.predict()
        assert scores == outcome.record["test"]  # the same numbers, to the last digit
        with open(run_dir / "predictions.csv") as handle:
            rows = list(csv.DictReader(handle))
        labels = load_split(TaskSpec.from_config(loaded.cfg.task), str(glue_dir), "test").labels
        assert [int(row["index"]) for row in rows] == list(range(len(labels)))  # the official dev split's order
        assert [float(row["label"]) for row in rows] == pytest.approx(labels.tolist(), abs=1e-5)
        assert [float(row["prediction"]) for row in rows] == pytest.approx(predictions.tolist(), abs=1e-5)
    from safetensors.torch import load_file

    saved = load_file(str(next(tmp_path.rglob("ln,*/**/weights.safetensors"))))
    assert set(saved) == {"bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias", "classifier.weight",
                          "classifier.bias"} | {f"bert.encoder.layer.{i}.{block}.LayerNorm.{kind}" for i in range(2)
                                                for block in ("attention.output", "output") for kind in ("weight", "bias")}


def test_fused_members_save_their_own_sizes(tiny_checkpoint, glue_dir, tmp_path):
    cfgs = configs(tiny_checkpoint, glue_dir, tmp_path, ["adapter", "adapter", "lora"], fuse="true")
    cfgs[1].method.bottleneck = 4
    cfgs[2].method.lora_rank = 2
    outcomes = run_group(cfgs)
    assert all(o.status == "ok" and o.record["fused"]["size"] == 3 for o in outcomes)
    from safetensors.torch import load_file

    small = load_file(str(next(tmp_path.rglob("adapter,bottleneck=4,*/**/weights.safetensors"))))
    assert small["bert.encoder.layer.0.output.adapter.down.weight"].shape == (4, 32)
    lora = load_file(str(next(tmp_path.rglob("lora,*/**/weights.safetensors"))))
    assert lora["bert.encoder.layer.1.attention.self.value.lora_a.weight"].shape == (2, 32)
    for outcome in outcomes:  # rebuilt alone, a member scores as it did in its group (up to float rounding)
        run_dir = next(tmp_path.rglob(f"{outcome.record['variant']}/rte/k16/seed111"))
        scores, _ = peltbench.load_run(run_dir).predict()
        assert scores == pytest.approx(outcome.record["test"], abs=1e-6)


def test_a_bf16_run_is_rescored_on_a_cpu_in_bf16(tiny_checkpoint, glue_dir, tmp_path):
    """Training in bf16 on a CPU is refused (runner.CPU_BF16), rescoring a saved bf16 run there is not: a run trained
    on a GPU in bf16 is rescored in its own precision, within bf16's rounding of the fp32 predictions (0.2% here)."""
    run_group(configs(tiny_checkpoint, glue_dir, tmp_path, ["lora"], task="stsb"))
    run_dir = next(tmp_path.rglob("lora,*/stsb/k16/seed111"))
    fp32 = peltbench.load_run(run_dir).predict()[1]
    record = json.loads((run_dir / "result.json").read_text())
    record["config"]["precision"] = record["precision"] = "bf16"  # as if it had trained on a GPU in bf16
    (run_dir / "result.json").write_text(json.dumps(record))
    loaded = peltbench.load_run(run_dir, device="cpu")
    assert loaded.bf16 and loaded.device.type == "cpu"
    bf16 = loaded.predict()[1]
    assert not np.array_equal(bf16, fp32)  # it did run in bf16
    np.testing.assert_allclose(bf16, fp32, rtol=0, atol=0.01 * np.abs(fp32).max())  # bf16 keeps 8 bits: 0.4%


def test_a_lora_run_loads_in_peft(tiny_checkpoint, glue_dir, tmp_path):
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import BertForSequenceClassification

    [outcome] = run_group(configs(tiny_checkpoint, glue_dir, tmp_path, ["lora"]))
    run_dir = next(tmp_path.rglob("lora,*/rte/k16/seed111"))
    assert (run_dir / "peft" / "adapter_config.json").is_file()
    config = json.loads((run_dir / "peft" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (8, 16.0, ["query", "value"])
    base = BertForSequenceClassification.from_pretrained(tiny_checkpoint, num_labels=2)
    peft_model = PeftModel.from_pretrained(base, run_dir / "peft").eval()
    ours = peltbench.load_run(run_dir).model
    ids = torch.randint(5, 64, (4, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(peft_model(input_ids=ids, attention_mask=mask).logits,
                                   ours(ids, mask, torch.zeros_like(ids)), rtol=1e-5, atol=1e-6)


def test_asking_for_weights_reruns_a_finished_run_that_has_none(tiny_checkpoint, glue_dir, tmp_path):
    plain = compose_config("method=bitfit", "task=rte", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path))
    [first] = run_group([plain])
    assert first.status == "ok" and not list(tmp_path.rglob("weights.safetensors"))
    [again] = run_group([plain])
    assert again.skipped
    [saved] = run_group(configs(tiny_checkpoint, glue_dir, tmp_path, ["bitfit"]))
    assert not saved.skipped and saved.record["test"] == first.record["test"]  # deterministic, same record folder
    assert len(list(tmp_path.rglob("weights.safetensors"))) == 1


def test_loggers_get_every_epoch_and_the_test_scores(tiny_checkpoint, glue_dir, tmp_path):
    pytest.importorskip("tensorboard")
    cfg = compose_config("method=unipelt_ap", "task=mrpc", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path),
                         "logger=[csv,tensorboard]", "train.patience=5")
    [outcome] = run_group([cfg])
    run_dir = next(tmp_path.rglob("unipelt_ap,*/mrpc/k16/seed111"))
    with open(run_dir / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["epoch"] for row in rows] == ["1", "2", "3", ""]
    for row, history in zip(rows, outcome.record["history"]):
        assert float(row["train_loss"]) == pytest.approx(history["train_loss"])
        assert float(row["dev_f1"]) == pytest.approx(history["dev_main"])
        assert float(row["lr"]) > 0 and float(row["epoch_seconds"]) > 0
        assert 0 < float(row["gate_adapter"]) < 1 and 0 < float(row["gate_prefix"]) < 1
    assert float(rows[-1]["test_f1"]) == pytest.approx(outcome.record["test"]["f1"])
    assert np.isclose(float(rows[0]["lr"]), 5e-4)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
