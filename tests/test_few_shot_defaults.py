"""Methods whose default setting does not learn in the few-shot protocol (issue 40, 6: RoAd at its default on
MiniLM, SST-2, K=500, 5 epochs: 51.49 against a majority class of 50.92, and no warning). Such a run is warned at its
start, naming the few-shot setting chosen on dev (config.FEW_SHOT, measured in docs/defaults.md); the default
stays as it is, so `method=road` keeps its meaning, hash and folder."""

from __future__ import annotations

import pytest

from conftest import compose_config
from peltbench.config import FEW_SHOT, few_shot_warning
from peltbench.record import config_hash, variant_name


def test_a_few_shot_run_at_the_published_setting_is_warned_at_its_start(workdir, in_process):
    common = ("task=rte", "model.name=tiny-bert", "data.dir=glue", "k=16", "dev_size=20", "train.epochs=1", "logger=[]")
    result = in_process("method=road", *common, cwd=workdir)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    [line] = [line for line in output.splitlines() if "did not learn" in line]
    lr = FEW_SHOT["road"]["chosen"]["lr"]
    assert "[WARNING]" in line and "method=road at its default lr 0.001 (its paper's full-data setting) did not learn" in line
    assert "test accuracy 51.49 against the majority class's 50.92" in line and "docs/defaults.md" in line
    assert line.endswith(f"the setting chosen on dev there: method.lr={lr:g}")
    assert output.index("run: ") < output.index("did not learn") < output.index("done: ")  # at the run's start
    again = in_process("method=road", f"method.lr={lr:g}", *common, cwd=workdir)  # the few-shot setting: no warning
    assert again.returncode == 0 and "did not learn" not in again.stdout + again.stderr


@pytest.mark.parametrize("name", sorted(FEW_SHOT))
def test_the_warning_is_for_few_shot_runs_at_the_default_values_and_says_what_length_was_measured(name):
    entry = FEW_SHOT[name]
    short = (f"method={name}", "task=sst2", "k=500", "train.epochs=5")  # 160 steps: the measurement's
    assert few_shot_warning(compose_config(*short))
    assert few_shot_warning(compose_config(f"method={name}", "task=sst2", "protocol=lmbff", "k=16",
                                           "train.max_steps=32", "train.eval_every=8"))
    assert few_shot_warning(compose_config(f"method={name}", "task=sst2", "protocol=full_median", "k=all")) is None
    other = {key: value * 3 for key, value in entry["default"].items()}
    assert few_shot_warning(compose_config(*short, *(f"method.{k}={v:g}" for k, v in other.items()))) is None
    chosen = (f"method.{k}={v:g}" for k, v in entry["chosen"].items())
    assert few_shot_warning(compose_config(*short, *chosen)) is None
    assert "not measured" not in few_shot_warning(compose_config(*short))
    # issue 40's example, the protocol's 50 epochs: 1,600 steps, warned, and told that its length was not measured
    long = few_shot_warning(compose_config(f"method={name}", "task=sst2", "k=500"))
    assert long and long.endswith(f"{entry['steps']} steps: docs/defaults.md; this run plans 1,600 steps, a length not "
                                  f"measured); the setting chosen on dev there: {' '.join(chosen_overrides(entry))}")


def chosen_overrides(entry: dict) -> list[str]:
    return [f"method.{key}={value:g}" for key, value in entry["chosen"].items()]


def test_methods_that_learn_at_their_published_setting_are_not_warned():
    assert few_shot_warning(compose_config("method=lora", "task=sst2", "k=500", "train.epochs=5")) is None


def test_the_demos_lr_is_roads_published_one_so_the_demo_with_road_is_warned():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        demo = compose(config_name="demo", overrides=["model.name=m", "method=road"])
    assert demo.method.lr == FEW_SHOT["road"]["default"]["lr"] and few_shot_warning(demo) is not None


def test_the_default_stays_and_keeps_its_folder_and_hash():
    """A record of `method=road` written before the few-shot setting existed is still the run of `method=road`."""
    for name, entry in FEW_SHOT.items():
        published, chosen = entry["default"], entry["chosen"]
        cfg = compose_config(f"method={name}", "task=sst2")
        assert {key: cfg.method[key] for key in published} == published
        assert variant_name(cfg) == name
        few = compose_config(f"method={name}", "task=sst2", *(f"method.{key}={value:g}" for key, value in chosen.items()))
        assert variant_name(few) != name and config_hash(few) != config_hash(cfg)  # its own folder, never the old one
    road = compose_config("method=road", "task=sst2", "k=500", "seed=111", "model.name=bert-base-uncased")
    assert config_hash(road) == ROAD_HASH  # the hash main at cadcef0 gave it


ROAD_HASH = "07495d8d573ae8ca"  # method=road task=sst2 k=500 seed=111 model.name=bert-base-uncased at cadcef0
