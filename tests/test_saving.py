"""Saved runs: weights.safetensors rebuilds the run (load_run), predictions.csv, the PEFT copy of a LoRA, loggers."""

from __future__ import annotations

import csv
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

import peltbench
from conftest import compose_config, tiny_run_overrides, write_glue
from peltbench import UserError
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
        assert list(rows[0]) == ["index", "label", "prediction"]  # STS-B: the one output is the prediction
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
        with open(run_dir / "predictions.csv") as handle:
            rows = list(csv.DictReader(handle))
        assert list(rows[0]) == ["index", "label", "prediction", "logit_0", "logit_1"]  # RTE: 2 classes
        logits = np.array([[float(row["logit_0"]), float(row["logit_1"])] for row in rows])
        assert len(np.unique(logits.round(6), axis=0)) > 1  # the model's outputs, not a constant
        assert logits.argmax(axis=1).tolist() == [int(row["prediction"]) for row in rows]
        correct = np.mean([row["label"] == row["prediction"] for row in rows])
        assert 100 * correct == pytest.approx(outcome.record["test"]["accuracy"], abs=1e-9)


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
    loaded = peltbench.load_run(run_dir)  # on the test device (make check-gpu: cuda); PEFT's copy goes there too
    base = BertForSequenceClassification.from_pretrained(tiny_checkpoint, num_labels=2)
    peft_model = PeftModel.from_pretrained(base, run_dir / "peft").eval().to(loaded.device)
    ours = loaded.model
    ids = torch.randint(5, 64, (4, 9), generator=torch.Generator().manual_seed(0)).to(loaded.device)
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
    assert [row["epoch"] for row in rows] == ["1", "2", "3"]  # an integer column; the result joins the best epoch's row
    for row, history in zip(rows, outcome.record["history"]):
        assert float(row["train_loss"]) == pytest.approx(history["train_loss"])
        assert float(row["dev_f1"]) == pytest.approx(history["dev_main"])
        assert float(row["lr"]) > 0 and float(row["epoch_seconds"]) > 0
        assert 0 < float(row["gate_adapter"]) < 1 and 0 < float(row["gate_prefix"]) < 1
    best = rows[outcome.record["best_epoch"] - 1]
    assert float(best["test_f1"]) == pytest.approx(outcome.record["test"]["f1"])
    assert float(best["dev_best_f1"]) == pytest.approx(outcome.record["dev_best"]["f1"])
    assert int(float(best["best_epoch"])) == outcome.record["best_epoch"]
    assert [row["test_f1"] != "" for row in rows].count(True) == 1
    assert np.isclose(float(rows[0]["lr"]), 5e-4)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


@pytest.fixture
def relative_run(tiny_checkpoint, tmp_path, monkeypatch):
    """A finished LoRA run started in tmp_path/project with model.name, data.dir and results_dir relative to it."""
    project = tmp_path / "project"
    shutil.copytree(tiny_checkpoint, project / "models" / "tiny")
    write_glue(project / "glue")
    monkeypatch.chdir(project)
    cfg = compose_config("method=lora", "task=rte", "model.name=models/tiny", "data.dir=glue", "results_dir=results",
                         "k=16", "dev_size=20", "train.epochs=2", "save.weights=true")
    [outcome] = run_group([cfg])
    assert outcome.status == "ok"
    run_dir = next((project / "results").rglob("seed111"))
    assert outcome.record["data_dir"] == str((project / "glue").resolve())
    assert outcome.record["model"] == str((project / "models" / "tiny").resolve())
    return project, run_dir, outcome.record


def test_a_copied_run_folder_loads_from_anywhere(relative_run, tmp_path, monkeypatch):
    project, run_dir, record = relative_run
    copy = shutil.copytree(run_dir, tmp_path / "elsewhere" / "my-run")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")  # model.name=models/tiny and data.dir=glue mean nothing here
    scores, _ = peltbench.load_run(copy).predict()
    assert scores == record["test"]

    older = json.loads((copy / "result.json").read_text())  # a record from before the data_dir field
    del older["data_dir"]
    (copy / "result.json").write_text(json.dumps(older))
    assert peltbench.load_run(copy).predict()[0] == record["test"]  # found from data_source


def test_a_moved_model_or_data_is_one_line_naming_the_override(relative_run, tmp_path, monkeypatch):
    project, run_dir, record = relative_run
    monkeypatch.chdir(tmp_path)
    (tmp_path / "moved").mkdir()
    model = shutil.move(project / "models" / "tiny", tmp_path / "moved" / "tiny")
    glue = shutil.move(project / "glue", tmp_path / "moved" / "glue")
    with pytest.raises(UserError, match=r"its model .*/models/tiny is not there: pass load_run\(run_dir, model=DIR\)"):
        peltbench.load_run(run_dir)
    loaded = peltbench.load_run(run_dir, model=model)
    with pytest.raises(UserError, match=r"its data .*/glue is not there: pass load_run\(run_dir, data_dir=DIR\)"):
        loaded.predict()
    assert peltbench.load_run(run_dir, model=model, data_dir=glue).predict()[0] == record["test"]
    with pytest.raises(UserError, match="model.name=.*nowhere: no such directory .*load_run\\(run_dir, model=...\\)"):
        peltbench.load_run(run_dir, model=tmp_path / "nowhere")
    write_glue(tmp_path / "other-glue", test_rows=10)  # other data: the test split does not have the run's rows
    with pytest.raises(UserError, match="other-glue: rte's test split has 10 rows where the run's had 24: not the data the run used"):
        peltbench.load_run(run_dir, model=model, data_dir=tmp_path / "other-glue").predict()


def test_a_weights_file_that_is_not_the_runs_is_one_line_naming_it(tiny_checkpoint, glue_dir, tmp_path):
    outcomes = run_group(configs(tiny_checkpoint, glue_dir, tmp_path, ["lora", "adapter", "bitfit"]))
    lora, adapter, bitfit = (Path(o.record["config"]["results_dir"]) / o.record["variant"] / "rte/k16/seed111"
                             for o in outcomes)
    weights = lora / "weights.safetensors"
    whole = weights.read_bytes()
    for broken, reason in ((whole[: len(whole) // 2], "incomplete metadata"), (b"", "header too small")):
        weights.write_bytes(broken)
        with pytest.raises(UserError) as error:
            peltbench.load_run(lora)
        assert str(error.value) == (f"{weights}: not a readable safetensors file, cut short or empty? (Error while "
                                    f"deserializing header: {reason}{', file not fully covered' if broken else ''})")
    shutil.copy(adapter / "weights.safetensors", weights)  # another method's file
    with pytest.raises(UserError, match=f"^{weights}: the weights of another run \\(of adapter\\), not of this "
                                        f"record's lora,.*/rte/k16/seed111$"):
        peltbench.load_run(lora)
    from safetensors.torch import load_file, save_file

    save_file(load_file(str(bitfit / "weights.safetensors")), str(weights))  # no metadata: the tensors decide
    with pytest.raises(UserError, match=f"^{weights}: not this run's weights \\(it lacks bert.encoder.layer.0.attention"
                                        f".self.query.lora_a.weight and [0-9]+ more differences\\)$"):
        peltbench.load_run(lora)


def test_saved_files_honour_the_umask(tiny_checkpoint, glue_dir, tmp_path):
    previous = os.umask(0o027)
    try:
        run_group(configs(tiny_checkpoint, glue_dir, tmp_path, ["lora"]))
    finally:
        os.umask(previous)
    run_dir = next(tmp_path.rglob("lora,*/rte/k16/seed111"))
    modes = {str(path.relative_to(run_dir)): stat.S_IMODE(path.stat().st_mode) for path in run_dir.rglob("*")
             if path.is_file() and path.name != ".lock"}
    assert modes == {name: 0o640 for name in ("result.json", "metrics.csv", "weights.safetensors", "predictions.csv",
                                              "peft/adapter_config.json", "peft/adapter_model.safetensors")}
    assert not list(run_dir.rglob("*.tmp"))


def test_lora_family_runs_fused_reload_and_load_in_peft(tiny_checkpoint, glue_dir, tmp_path):
    """DoRA, LoRA-FA and VeRA in one fused group: each saves its tensors, load_run rescores it, and its peft/ copy
    (LoRA-FA with its frozen A, VeRA with its shared A and B) predicts in PEFT what load_run's model predicts."""
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import BertForSequenceClassification

    cfgs = configs(tiny_checkpoint, glue_dir, tmp_path, ["dora", "lora_fa", "vera"], fuse="true")
    cfgs[2].method.vera_rank = 16
    outcomes = run_group(cfgs)
    assert [o.status for o in outcomes] == ["ok"] * 3 and {o.record["fused"]["size"] for o in outcomes} == {3}
    ids = torch.randint(5, 64, (4, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    for outcome, kind in zip(outcomes, ("LORA", "LORA", "VERA")):
        run_dir = next(tmp_path.rglob(f"{outcome.record['variant']}/rte/k16/seed111"))
        assert outcome.record["saved"] == ["weights.safetensors", "peft/adapter_config.json",
                                           "peft/adapter_model.safetensors", "predictions.csv"]
        loaded = peltbench.load_run(run_dir)
        assert loaded.predict()[0] == pytest.approx(outcome.record["test"], abs=1e-6)
        assert json.loads((run_dir / "peft" / "adapter_config.json").read_text())["peft_type"] == kind
        base = BertForSequenceClassification.from_pretrained(tiny_checkpoint, num_labels=2)
        peft_model = PeftModel.from_pretrained(base, run_dir / "peft").eval().to(loaded.device)
        on = dict(input_ids=ids.to(loaded.device), attention_mask=mask.to(loaded.device))  # the device it loaded to
        with torch.no_grad():
            torch.testing.assert_close(peft_model(**on).logits,
                                       loaded.model(on["input_ids"], on["attention_mask"], torch.zeros_like(on["input_ids"])),
                                       rtol=1e-5, atol=1e-6)


def test_no_peft_copy_where_peft_has_no_such_method_on_the_encoder():
    """ModernBERT's fused Wqkv: PEFT's VeRA has one λ_d and B for q, k and v: one line why."""
    from omegaconf import OmegaConf

    from peltbench.architectures import architecture
    from peltbench.packaged import packaged_config
    from peltbench.saving import peft_kind

    modernbert, bert = architecture("modernbert"), architecture("bert")
    for name, kind in (("lora", "LORA"), ("lora_fa", "LORA"), ("dora", "LORA"), ("vera", "VERA")):
        assert peft_kind(packaged_config(f"method/{name}.yaml"), bert) == (kind, None)
    assert peft_kind(packaged_config("method/lora.yaml"), modernbert) == ("LORA", None)
    assert peft_kind(packaged_config("method/dora.yaml"), modernbert) == ("LORA", None)  # tests/test_dora.py
    kind, why = peft_kind(packaged_config("method/vera.yaml"), modernbert)
    assert kind is None and "Wqkv" in why and "\n" not in why
    gated = OmegaConf.merge(packaged_config("method/vera.yaml"), {"gated": True})
    assert peft_kind(gated, bert) == (None, None)


def test_two_identical_runs_write_byte_equal_files(tiny_checkpoint, glue_dir, tmp_path):
    """safetensors writes its metadata in a hash map's order, different at every write: saving sorts it."""
    for results in ("a", "b"):
        run_group(configs(tiny_checkpoint, glue_dir, tmp_path / results, ["lora"]))
    first, second = (next((tmp_path / results).rglob("lora,*/rte/k16/seed111")) for results in ("a", "b"))
    for name in ("weights.safetensors", "peft/adapter_model.safetensors", "predictions.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


@pytest.mark.parametrize("ascii_only", [False, True])  # True: a JSON longer than safetensors' (the header is rewritten)
def test_safetensors_metadata_is_written_in_one_order(tmp_path, monkeypatch, ascii_only):
    from safetensors import safe_open

    from peltbench import saving

    if ascii_only:
        monkeypatch.setattr(saving.json, "dumps", lambda value, **kw: json.JSONEncoder(
            separators=(",", ":"), ensure_ascii=True).encode(value))
    metadata = {key: value for key, value in zip("qwertyuiop", ('a "quoted" \\ path', "modèle ✓", "line\nbreak\t",
                                                               "\x01", "{}", "", "x" * 40, "z", "y", "w"))}
    tensors = {"b": torch.arange(3.0), "a": torch.ones(2, 5, dtype=torch.float16), "c": torch.tensor([7])}
    written = set()
    for attempt in range(6):
        saving.save_safetensors(tensors, tmp_path / "w.safetensors", metadata)
        written.add((tmp_path / "w.safetensors").read_bytes())
        with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as handle:
            assert handle.metadata() == metadata
            assert {name: handle.get_tensor(name).tolist() for name in handle.keys()} == {
                name: tensor.tolist() for name, tensor in tensors.items()}
    assert len(written) == 1
    size = int.from_bytes(next(iter(written))[:8], "little")
    assert (8 + size) % 8 == 0  # the tensors' data stays aligned
