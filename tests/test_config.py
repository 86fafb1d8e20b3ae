"""Hydra composition of every method × task, overrides, and how a config names and identifies its run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from conftest import compose_config
from peltbench import UserError
from peltbench.packaged import options, packaged_config
from peltbench.record import config_hash, record_path, variant_name
from peltbench.config import CPU_BF16, METHOD_SETTINGS, check_config, method_settings

METHODS, TASKS = options("method"), options("task")


def test_menus():
    assert METHODS == sorted(["ft", "bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_apl",
                              "unipelt_ap_nogate", "unipelt_apl_nogate", "ln", "prefix_ln", "mam", "mam_he",
                              "dora", "lora_fa", "vera", "adalora", "oft", "hra", "boft",
                              "ia3", "ptuning_v2", "prompt", "fourierft", "c3a", "road", "delora"])
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
    assert {m for m, h in heads.items() if h == "frozen"} == {"prefix", "prefix_l50", "lora", "lora_fa", "dora", "vera",
                                                                   "fourierft", "c3a"}
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


BAD_VALUES = [
    ("k=abc", "k=abc: must be a positive number"), ("k=0", "k=0"), ("k=-1", "k=-1"), ("k=1.5", "k=1.5"),
    ("k=true", "k=true"), ("seed=-1", "seed=-1"), ("seed=1.5", "seed=1.5"), ("model_seed=x", "model_seed=x"),
    ("dev_size=0", "dev_size=0"), ("train.batch_size=0", "train.batch_size=0"), ("train.epochs=2.5", "train.epochs=2.5"),
    ("train.patience=-3", "train.patience=-3"), ("train.max_length=0", "train.max_length=0"),
    ("train.eval_batch_size=none", "train.eval_batch_size=none"), ("train.grad_clip=0", "train.grad_clip=0"),
    ("train.grad_clip=inf", "train.grad_clip=inf"), ("precision=fp16", "precision=fp16: must be auto, bf16 or fp32"),
    ("device=gpu", "device=gpu: must be auto, cpu, cuda, cuda:N or mps"), ("device=cuda:x", "device=cuda:x"),
    ("device=cuda1", "device=cuda1"), ("model.name=''", "model.name=: must be"),
    ("data.dir=3", "data.dir=3: must be a folder (a local GLUE copy, or the one a task file's relative files are under)"),
    ("results_dir=''", "results_dir="),
    ("method.head=sometimes", "method.head=sometimes: must be one of train, bias, frozen"),
    ("method.lr=0", "method.lr=0: must be a positive number"), ("method.lr=-1e-4", "method.lr=-0.0001"),
    ("method.lr=abc", "method.lr=abc"), ("method.bottleneck=0", "method.bottleneck=0: must be a positive integer"),
    ("method.bottleneck=4.5", "method.bottleneck=4.5"), ("method.gated=yes", "method.gated=yes: must be true or false"),
    ("method.gated=1", "method.gated=1"), ("method.components=[adapter,wings]", "method.components=[adapter,wings]"),
    ("method.components=[]", "method.components=[]"), ("method.components=[adapter,adapter]", "[adapter,adapter]"),
    ("method.gate_pooling=mean", "method.gate_pooling=mean: must be masked or padded"),
]


@pytest.mark.parametrize("override,message", BAD_VALUES)
def test_bad_values_are_user_errors(override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_config(compose_config("method=adapter", "task=cola", override))


def test_bf16_on_a_cpu_is_refused_before_anything_runs():
    """On a CPU bf16 trains slower than fp32 (config.CPU_BF16); device=auto is refused when it turns out to be a CPU
    (runner.resolve_device, tests/test_train.py)."""
    with pytest.raises(UserError, match=re.escape(CPU_BF16)):
        check_config(compose_config("method=lora", "task=rte", "device=cpu", "precision=bf16"))
    for device in ("auto", "cuda"):
        check_config(compose_config("method=lora", "task=rte", f"device={device}", "precision=bf16"))
    check_config(compose_config("method=lora", "task=rte", "device=cpu", "precision=fp32"))


@pytest.mark.parametrize("method,override,message", [
    ("lora", "method.lora_rank=0", "method.lora_rank=0: must be a positive integer"),
    ("lora", "method.lora_scale=0", "method.lora_scale=0: must be a positive number"),
    ("lora", "method.lora_targets=[query,output]", "method.lora_targets=[query,output]: must be a list of distinct"),
    ("lora", "method.lora_targets=[query,query]", "method.lora_targets=[query,query]"),
    ("lora", "method.lora_targets=[]", "method.lora_targets=[]"),
    ("lora", "method.lora_targets=query", "method.lora_targets=query"),
    ("prefix", "method.prefix_length=-10", "method.prefix_length=-10"),
    ("prefix", "method.prefix_hidden=0", "method.prefix_hidden=0"),
    ("mam", "method.adapter_scale=-4", "method.adapter_scale=-4"),
])
def test_bad_method_values_are_user_errors(method, override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_config(compose_config(f"method={method}", "task=rte", override))


@pytest.mark.parametrize("overrides", [
    ("k=all",), ("k=1",), ("seed=0",), ("device=cpu",), ("device=cuda",), ("device=cuda:3",), ("device=mps",),
    ("precision=bf16",), ("train.grad_clip=5",), ("method.lr=1",), ("method.gate_pooling=padded",),
    ("data.dir=/data/glue",), ("method.components=[adapter,lora]", "+method.lora_rank=4", "+method.lora_scale=2",
                               "+method.lora_targets=[key]"),
    ("fuse=true", "fuse_members=8", "save.weights=true", "save.predictions=false"),
])
def test_good_values_pass(overrides):
    check_config(compose_config("method=adapter", "task=cola", *overrides))


BAD_KEYS = [
    (("+train.epoch=3",), "train.epoch: not a peltbench setting; train has batch_size, checkpoint_every, epochs, "
                          "eval_batch_size"),
    (("+model.revision=main",), "model.revision: not a peltbench setting; model has name"),
    (("+epochs=3",), "epochs: not a peltbench setting"),
    (("+method.bottlenek=256",), "method.bottlenek: not a setting of method adapter"),
    (("+method.lora_rank=4",), "method.lora_rank: not a setting of method adapter (components [adapter])"),
    (("+task.num_label=3",), "task.num_label: not a setting of task cola"),
    (("~train.patience",), "train.patience: missing"),
    (("method.components=[adapter,lora]",), "method.lora_rank: missing; components [adapter,lora] need it"),
    (("fuse=1",), "fuse=1: must be true or false"), (("fuse_members=0",), "fuse_members=0: must be a positive"),
    (("save.weights=yes",), "save.weights=yes: must be true or false"),
    (("+save.weight=true",), "save.weight: not a peltbench setting; save has predictions, weights"),
]


@pytest.mark.parametrize("overrides,message", BAD_KEYS)
def test_unknown_and_missing_keys_are_user_errors(overrides, message):
    """`+train.epoch=3` used to run a 50-epoch job, and `+method.bottlenek=256` an unchanged run in a new folder."""
    with pytest.raises(UserError, match=re.escape(message)):
        check_config(compose_config("method=adapter", "task=cola", *overrides))


def plain(cfg):
    """`cfg` as plain data, as a sweep's run (peltbench.missing) or a record's config is read."""
    from peltbench.missing import _plain
    from peltbench.record import container

    return _plain(container(cfg))


@pytest.mark.parametrize("overrides,message", [
    *(((override,), message) for override, message in BAD_VALUES), *BAD_KEYS,
    (("device=cpu", "precision=bf16"), CPU_BF16), (("k=7", "+method.lora_rank=4"), "method.lora_rank: not a setting"),
])
def test_a_sweeps_run_is_refused_as_alone_though_its_other_nodes_were_checked(overrides, message):
    """Inside a sweep's pass (peltbench.passes) a node is checked once by value: a run of plain data whose other
    nodes earlier runs had (equal copies) is refused with the line the same run gets alone, also for two mistakes
    (the first one's line)."""
    from peltbench.passes import one_pass

    cfg = compose_config("method=adapter", "task=cola", *overrides)
    with pytest.raises(UserError, match=re.escape(message)) as alone:
        check_config(cfg)
    with one_pass():
        check_config(plain(compose_config("method=adapter", "task=cola")))
        check_config(plain(compose_config("method=adapter", "task=cola", "seed=3", "k=1")))  # k=true is another k
        with pytest.raises(UserError) as swept:
            check_config(plain(cfg))
    assert str(swept.value) == str(alone.value)


def test_a_sweep_checks_each_distinct_node_once_and_each_run_for_what_relates_its_nodes(monkeypatch):
    """k=all and protocol=lmbff, each valid in a run of their own, are refused together (lmbff samples K rows per
    class): what relates a run's nodes is checked for every run, each node once per pass by value (equal copies,
    as each run's config or record has them, alike); the next pass asks again."""
    from peltbench import config
    from peltbench.passes import one_pass

    asked = []
    for name in ("check_task", "check_method", "check_schedule", "check_logger"):
        def counted(node, check=getattr(config, name), name=name):
            asked.append(name)
            return check(node)
        monkeypatch.setattr(config, name, counted)
    runs = [plain(compose_config("method=lora", "task=rte", *overrides))
            for overrides in [("k=all",), ("protocol=lmbff", "k=16"), ("k=all", "seed=3"), ("protocol=lmbff", "k=8")]]
    bad = plain(compose_config("method=lora", "task=rte", "protocol=lmbff", "k=16"))
    bad["k"] = "all"  # as a record's config could hold it: compose_config refuses nothing
    with one_pass():
        for run in runs:
            check_config(run)
        # protocol=lmbff has a task (a longer prompt), method (its head) and train of its own: two of each
        assert sorted(asked) == sorted(["check_task", "check_method", "check_schedule"] * 2 + ["check_logger"])
        with pytest.raises(UserError, match="k=all: protocol=lmbff samples K train rows per class"):
            check_config(bad)
    with one_pass():
        check_config(runs[0])
    check_config(runs[0])
    assert len(asked) == 7 + 4 + 4


def test_method_and_task_are_required():
    with pytest.raises(UserError, match="method= is required: one of adalora, adapter, bitfit, "):
        check_config(compose_config("task=cola"))
    with pytest.raises(UserError, match="task= is required: one of cola, mnli"):
        check_config(compose_config("method=lora"))


def test_every_packaged_method_setting_is_known():
    """The settings the components declare are those conf/method/*.yaml use, and the declared components are the
    modules methods/ has."""
    from peltbench.component import builtin_names
    from peltbench.methods import COMPONENTS

    assert list(builtin_names()) == list(COMPONENTS)
    used = {key for method in METHODS for key in packaged_config(f"method/{method}.yaml")}
    assert used - {"components"} <= set(METHOD_SETTINGS) | set(method_settings())


def test_k_all_is_accepted():
    cfg = compose_config("method=adapter", "task=rte", "k=all")
    check_config(cfg)
    assert record_path(cfg, Path("r")).parent.name == "seed111" and record_path(cfg, Path("r")).parts[-3] == "kall"


def test_a_runs_planned_work_counts_its_training_and_dev_rows_at_max_length():
    """config.planned_work: which group a sweep on several devices hands out first (peltbench.workers)."""
    from peltbench.config import planned_work

    # UniPELT's protocol, K = 100: 7 steps of 16 rows for 50 epochs, each row 3 times (forward and backward), and
    # 50 dev evaluations of 1,000 rows, all at 128 tokens
    assert planned_work(compose_config("method=lora", "task=rte", "k=100")) == 128 * (3 * 350 * 16 + 50 * 1000)
    # LM-BFF's: 1,000 steps of 8 rows, dev (16 rows per class) every 100 steps
    lmbff = compose_config("method=lora", "task=rte", "protocol=lmbff")
    assert planned_work(lmbff) == lmbff.train.max_length * (3 * 1000 * 8 + 10 * 32)
    assert planned_work(compose_config("method=lora", "task=rte", "k=all")) is None  # its rows come with its data
