"""Hydra composition of every method × task, overrides, and how a config names and identifies its run."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from conftest import compose_config
from peltbench import UserError
from peltbench.packaged import options
from peltbench.record import config_hash, record_path, variant_name
from peltbench.runner import check_config

METHODS, TASKS = options("method"), options("task")


def test_menus():
    assert METHODS == sorted(["ft", "bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_apl",
                              "unipelt_ap_nogate", "unipelt_apl_nogate", "ln", "prefix_ln", "mam"])
    assert TASKS == sorted(["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"])


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("method", METHODS)
def test_every_method_and_task_composes(method, task):
    cfg = compose_config(f"method={method}", f"task={task}")
    check_config(cfg)
    assert cfg.method.name == method and cfg.task.name == task
    assert (cfg.k, cfg.seed, cfg.model_seed, cfg.dev_size) == (100, 111, 42, 1000)
    assert cfg.task.main_metric in cfg.task.metrics
    assert record_path(cfg, Path("r")) == Path(f"r/{method}/{task}/k100/seed111/result.json")


@pytest.mark.parametrize("method,lr", [("ft", 2e-5), ("bitfit", 1e-4), ("adapter", 1e-4), ("prefix", 2e-4),
                                       ("lora", 5e-4), ("unipelt_ap", 5e-4), ("unipelt_apl", 5e-4)])
def test_learning_rates_are_app_b(method, lr):
    assert compose_config(f"method={method}", "task=rte").method.lr == lr


def test_heads_follow_the_official_code():
    """METHODS.md: head frozen for prefix and LoRA, bias only for BitFit, trained otherwise."""
    heads = {m: compose_config(f"method={m}", "task=rte").method.head for m in METHODS}
    assert {m for m, h in heads.items() if h == "frozen"} == {"prefix", "prefix_l50", "lora"}
    assert heads["bitfit"] == "bias"


def test_overrides_change_settings_and_the_folder():
    cfg = compose_config("method=adapter", "task=cola", "method.bottleneck=256", "method.gated=true", "k=500", "seed=222")
    assert cfg.method.bottleneck == 256 and cfg.method.gated is True
    assert variant_name(cfg) == "adapter,gated=True,bottleneck=256"
    assert record_path(cfg, Path("r")).parent == Path("r/adapter,gated=True,bottleneck=256/cola/k500/seed222")
    cfg = compose_config("method=lora", "task=rte", "method.lora_scale=4", "model.name=/some/dir/my-bert", "train.epochs=5")
    assert variant_name(cfg) == "lora,lora_scale=4,model.name=dir_my-bert,train.epochs=5"


def test_a_value_equal_to_the_default_is_the_same_run():
    plain = compose_config("method=adapter", "task=cola")
    explicit = compose_config("method=adapter", "task=cola", "method.bottleneck=48", "results_dir=elsewhere",
                              "device=cpu", "train.eval_batch_size=7", "data.dir=/data/glue")
    assert variant_name(explicit) == "adapter"
    assert config_hash(explicit) == config_hash(plain)


def test_hash_changes_with_anything_that_changes_results():
    base = config_hash(compose_config("method=adapter", "task=cola"))
    for override in ("method.bottleneck=64", "seed=222", "k=500", "task=rte", "model_seed=1", "train.max_length=64",
                     "model.name=other", "dev_size=500", "method.lr=0.001"):
        assert config_hash(compose_config("method=adapter", "task=cola", override)) != base, override


def test_unknown_keys_and_groups_are_rejected_by_hydra():
    with pytest.raises(ConfigCompositionException, match="bottlenek"):
        compose_config("method=adapter", "task=cola", "method.bottlenek=3")
    with pytest.raises(ConfigCompositionException):
        compose_config("method=lora", "task=cola", "method.bottleneck=3")  # LoRA has no bottleneck
    with pytest.raises(Exception, match="Could not find 'method/adaptr'"):
        compose_config("method=adaptr", "task=cola")


@pytest.mark.parametrize("override,message", [
    ("k=abc", "k=abc: must be a positive number"), ("k=0", "k=0"), ("seed=-1", "seed=-1"),
    ("train.batch_size=0", "train.batch_size=0"), ("precision=fp16", "precision=fp16"),
    ("method.head=sometimes", "head must be one of"),
])
def test_bad_values_are_user_errors(override, message):
    with pytest.raises(UserError, match=message):
        check_config(compose_config("method=adapter", "task=cola", override))


def test_k_all_is_accepted():
    cfg = compose_config("method=adapter", "task=rte", "k=all")
    check_config(cfg)
    assert record_path(cfg, Path("r")).parent.name == "seed111" and record_path(cfg, Path("r")).parts[-3] == "kall"
