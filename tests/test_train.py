"""Early stopping stops and restores the best state; a run is deterministic; a crash leaves a `failed` record."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import compose_config, tiny_backbone, tiny_run_overrides
from peltbench.data import Encoded
from peltbench.methods import build_pelt_model
from peltbench import UserError
from peltbench.config import CPU_BF16
from peltbench.packaged import packaged_config
from peltbench.runner import run_experiment
from peltbench.tasks import TaskSpec
from peltbench.train import GroupSettings, Member, TrainSettings, fit


def _tiny_training_set(n: int = 8) -> Encoded:
    rng = np.random.default_rng(0)
    ids = [[2, *rng.integers(5, 60, 6).tolist(), 3] for _ in range(n)]
    return Encoded(ids, [[0] * len(i) for i in ids], rng.integers(0, 2, n))


def _fit_scripted(monkeypatch, model, task, data, scores, settings):
    """Train one member whose dev scores follow a script; remember the adapter weights each evaluation saw."""
    import peltbench.train

    seen = {"dev": [], "test": []}

    def scripted(model, sets, task, group, label, keep=False):
        seen[label].append(model.layers[0].output.adapter.down.weight[0].detach().clone())
        score = scores[len(seen["dev"]) - 1] if label == "dev" else 0.0
        result = [{"accuracy": score, "main": score}], 0.0
        return (*result, [np.zeros((len(sets[0]), 2))]) if keep else result  # keep: the outputs, rows x classes

    monkeypatch.setattr(peltbench.train, "evaluate", scripted)
    results = []
    member = Member("scripted", data, data, data, settings)
    fit(model, [member], task, GroupSettings(), lambda index, result: results.append(result))
    return results[0], seen


def test_early_stopping_stops_after_patience_and_restores_the_best_state(monkeypatch):
    task = TaskSpec.from_config(compose_config("method=adapter", "task=rte").task)
    model = build_pelt_model(tiny_backbone(), packaged_config("method/adapter.yaml"), 42)
    # best 60 at epoch 2; 60 again at 4 is no strict improvement
    result, seen = _fit_scripted(monkeypatch, model, task, _tiny_training_set(), [50, 60, 55, 60, 59, 58, 70],
                                 TrainSettings(lr=1e-2, epochs=7, patience=3))
    assert (result.best_epoch, result.epochs_run) == (2, 5)
    assert result.dev_best == {"accuracy": 60, "main": 60}
    assert [h["dev_main"] for h in result.history] == [50, 60, 55, 60, 59]
    [tested] = seen["test"]
    torch.testing.assert_close(tested, seen["dev"][1], rtol=0, atol=0)  # the test set saw the best state
    assert not torch.equal(seen["dev"][1], seen["dev"][4])  # training did move the weights after epoch 2
    assert result.train_steps == 5  # 8 examples, batch 16 → 1 step per epoch


def test_undefined_dev_scores_never_count_as_improvement(monkeypatch):
    task = TaskSpec.from_config(compose_config("method=adapter", "task=stsb").task)
    data = _tiny_training_set()
    data.labels = data.labels.astype(np.float32)
    model = build_pelt_model(tiny_backbone(num_labels=1), packaged_config("method/adapter.yaml"), 42)
    result, _ = _fit_scripted(monkeypatch, model, task, data, [None, None, None, None],
                              TrainSettings(lr=1e-3, epochs=4, patience=2))
    assert (result.best_epoch, result.epochs_run) == (1, 3)


def test_same_config_on_cpu_gives_identical_records(tiny_checkpoint, glue_dir, tmp_path):
    records = []
    for name in ("first", "second"):
        cfg = compose_config("method=unipelt_apl", "task=mrpc", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path / name))
        records.append(run_experiment(cfg, tmp_path / name))
    first, second = records
    for field in ("test", "dev_best", "best_epoch", "epochs_run", "history", "gates", "split"):
        assert first[field] == second[field], field
    assert first["status"] == "ok" and first["gates"] is not None


def test_a_crash_writes_a_failed_record_and_a_rerun_retries(tiny_checkpoint, glue_dir, tmp_path, monkeypatch):
    import peltbench.runner

    cfg = compose_config("method=lora", "task=rte", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path))

    def broken_fit(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(peltbench.runner, "fit", broken_fit)
    with pytest.raises(RuntimeError):
        run_experiment(cfg, tmp_path)
    path = next(tmp_path.rglob("result.json"))
    failed = json.loads(path.read_text())
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: CUDA out of memory (simulated)"
    assert failed["test"] is None and "broken_fit" in failed["traceback"]
    monkeypatch.undo()
    retried = run_experiment(cfg, tmp_path)
    assert retried["status"] == "ok" and json.loads(path.read_text())["status"] == "ok"


def test_bf16_is_refused_when_device_auto_finds_only_a_cpu(tiny_checkpoint, glue_dir, tmp_path, monkeypatch):
    """Before the model loads (model.name points nowhere), and with no record: one line, CPU_BF16. device=auto whatever
    the test device (make check-gpu runs this file with device=cuda), on a machine made to have no CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    overrides = [*tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path), "device=auto", "model.name=nowhere/",
                 "precision=bf16"]
    with pytest.raises(UserError) as refused:
        run_experiment(compose_config("method=lora", "task=rte", *overrides), tmp_path)
    assert str(refused.value) == CPU_BF16
    assert not list(tmp_path.rglob("result.json"))


def test_cached_backbone_copies_equal_a_fresh_load_and_are_independent(tiny_checkpoint):
    from transformers import BertForSequenceClassification

    from peltbench.model import load_backbone

    first = load_backbone(str(tiny_checkpoint), 3, 42)
    with torch.no_grad():
        first.classifier.weight.add_(1.0)  # training one run must not touch the next run's model
    second = load_backbone(str(tiny_checkpoint), 3, 42)
    torch.manual_seed(42)
    fresh = BertForSequenceClassification.from_pretrained(tiny_checkpoint, num_labels=3, ignore_mismatched_sizes=True)
    for (name, a), (_, b) in zip(second.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("method,task,k", [("ft", "stsb", 16), ("mam", "mnli", 16), ("prefix_ln", "cola", "all")])
def test_runs_regression_three_way_and_k_all(method, task, k, tiny_checkpoint, glue_dir, tmp_path):
    overrides = [*tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path), f"k={k}", "train.epochs=2"]
    record = run_experiment(compose_config(f"method={method}", f"task={task}", *overrides), tmp_path)
    assert record["status"] == "ok" and record["epochs_run"] == 2
    expected = {"stsb": {"spearman", "pearson", "main"}, "mnli": {"accuracy", "main"}, "cola": {"mcc", "main"}}[task]
    assert set(record["test"]) == expected
    if k == "all":  # Table 3: trained on all 60 rows, selected and reported on the official dev split
        assert record["split"] == {"train_indices": None, "dev_indices": None}
        assert record["test"] == record["dev_best"] and record["train_steps"] == 2 * 4  # ceil(60 / 16) per epoch


def test_slurm_jobs_use_their_allocated_cpus(monkeypatch):
    from peltbench.runner import use_allocated_cpus

    before = torch.get_num_threads()
    allocated = 2 if before == 1 else 1  # not the count it has (make test's workers run with 1 thread each)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", str(allocated))
    try:
        use_allocated_cpus()
        assert torch.get_num_threads() == allocated
    finally:
        torch.set_num_threads(before)


def test_a_fused_members_seconds_are_its_share_of_the_rows_and_a_run_alone_keeps_all():
    """In a group each member records the group's seconds and its part of them: each training period split by the rows
    each member trained (the same: a third each), each evaluation by the rows each evaluated (8, 16 and 24)."""
    task = TaskSpec.from_config(compose_config("method=adapter", "task=rte").task)
    methods = [packaged_config(f"method/{name}.yaml") for name in ("adapter", "lora", "bitfit")]
    model = build_pelt_model(tiny_backbone(), methods, [42, 42, 42], [tiny_backbone(seed=s) for s in (1, 2, 3)])
    train, rows = _tiny_training_set(8), (8, 16, 24)
    members = [Member(f"m{m}", train, _tiny_training_set(n), _tiny_training_set(n), TrainSettings(lr=1e-2, epochs=2))
               for m, n in enumerate(rows)]
    results = {}
    fit(model, members, task, GroupSettings(), lambda index, result: results.__setitem__(index, result))
    group = [results[m] for m in range(3)]
    assert len({r.train_seconds for r in group}) == 1 and len({r.eval_seconds for r in group}) == 1  # the group's
    train_seconds, eval_seconds = group[0].train_seconds, group[0].eval_seconds  # 2 dev passes and 1 test pass
    assert sum(r.train_seconds_share for r in group) == pytest.approx(train_seconds, rel=1e-12)
    assert [r.train_seconds_share for r in group] == pytest.approx([train_seconds / 3] * 3, rel=1e-12)
    assert sum(r.eval_seconds_share for r in group) == pytest.approx(eval_seconds, rel=1e-12)
    assert [r.eval_seconds_share for r in group] == pytest.approx([eval_seconds * n / sum(rows) for n in rows], rel=1e-12)

    alone = {}
    model = build_pelt_model(tiny_backbone(), methods[0], 42)
    fit(model, [Member("alone", train, train, train, TrainSettings(lr=1e-2, epochs=2))], task, GroupSettings(),
        lambda index, result: alone.__setitem__(index, result))
    assert (alone[0].train_seconds_share, alone[0].eval_seconds_share) == (alone[0].train_seconds, alone[0].eval_seconds)
    assert alone[0].train_seconds > 0 and alone[0].eval_seconds > 0
