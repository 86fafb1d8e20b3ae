"""A bad member fails only itself (issue 24 item 1): what the config can tell is refused before torch loads, in one
line naming the run; a member its group cannot be built with fails alone, with its own reason, and the others train
and write the records they write alone."""

from __future__ import annotations

import json
import re

import pytest

from conftest import compose_config, tiny_run_overrides
from peltbench import UserError
from peltbench.config import check_config


@pytest.mark.parametrize("overrides,message", [
    (("method=vera", "method.components=[vera,ia3]", "method.gated=true"),
     "method vera: gated: true, but component ia3 has no gate"),
    (("method=adalora", "method.adalora_tfinal=0.84", "train.epochs=1"),
     "method=adalora task=rte: adalora: 7 training steps leave no budgeting phase"),
])
def test_what_the_config_tells_is_refused_before_torch(overrides, message):
    with pytest.raises(UserError, match=message):
        check_config(compose_config("task=rte", *overrides))


def test_a_gate_setting_belongs_to_exactly_the_components_that_have_a_gate():
    """config.COMPONENT_SETTINGS (torch-free) says which components read `gated`; methods.COMPONENTS' GATE says which
    have a gate: the check before torch and the one at build time agree."""
    from peltbench.config import COMPONENT_SETTINGS
    from peltbench.methods import COMPONENTS

    assert {c for c, keys in COMPONENT_SETTINGS.items() if "gated" in keys} == \
        {c for c, module in COMPONENTS.items() if module.GATE is not None}


@pytest.mark.parametrize("overrides,message", [
    (("method=oft", "method.oft_block_size=5"), "method=oft task=rte: oft_block_size=5 must divide the adapted "
                                                 "projections' input size 32"),
    (("method=boft", "method.boft_block_size=8", "method.boft_factors=4"), "boft_block_size=8 with boft_factors=4"),
])
def test_a_local_models_config_json_is_checked_before_torch(tiny_checkpoint, overrides, message):
    assert json.loads((tiny_checkpoint / "config.json").read_text())["hidden_size"] == 32
    with pytest.raises(UserError, match=message):
        check_config(compose_config("task=rte", f"model.name={tiny_checkpoint}", *overrides))
    check_config(compose_config("task=rte", f"model.name={tiny_checkpoint}", overrides[0]))


@pytest.mark.parametrize("method,message", [
    ("prompt", "the longest row's 120 tokens + prompt_length 20 = 140 positions, but the model has 128 "
               "(max_position_embeddings): set train.max_length=108 or lower"),
    ("ptuning_v2", "the longest row's 120 tokens + prefix_length (its positions come first) 20 = 140 positions"),
])
def test_rows_beyond_the_position_table_are_one_line_not_a_torch_error(method, message):
    from peltbench.config import check_model_fit

    table = {"model_type": "bert", "hidden_size": 32, "max_position_embeddings": 128}
    cfg = compose_config(f"method={method}", "task=rte")
    with pytest.raises(UserError, match=re.escape(message)):
        check_model_fit(cfg, table, longest=120)
    check_model_fit(cfg, table, longest=100)  # 100 + 20 fits
    with pytest.raises(UserError, match=re.escape("the longest row's 128 tokens + RoBERTa's offset 2 = 130")):
        check_model_fit(compose_config("method=lora", "task=rte"),
                        {"model_type": "roberta", "pad_token_id": 1, "max_position_embeddings": 128}, longest=128)


def test_a_member_the_group_cannot_be_built_with_fails_alone_and_the_others_train_as_alone(
        tiny_checkpoint, glue_dir, tmp_path, monkeypatch):
    """OFT block size 4 made to fail at build time (as a check only the model can make would): the group is rebuilt
    without it; its failed record has its own reason; block size 8 writes the record it writes alone."""
    from peltbench.methods import oft
    from peltbench.runner import run_group

    real = oft.shape

    def shape(method, features):
        if int(method.oft_block_size) == 4:
            raise ValueError("block size 4 cannot be built here")
        return real(method, features)

    monkeypatch.setattr(oft, "shape", shape)

    def cfg(block, results):
        return compose_config("method=oft", "task=rte", f"method.oft_block_size={block}", "train.epochs=2",
                              "logger=[]", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path / results))

    bad, good = run_group([cfg(4, "group"), cfg(8, "group")])
    assert bad.status == "failed" and bad.record["error"] == "ValueError: block size 4 cannot be built here"
    assert good.status == "ok" and good.record["fused"] is None or good.record["fused"]["size"] == 1
    [alone] = run_group([cfg(8, "alone")])
    assert alone.status == "ok"
    for mine, its in zip(good.record["history"], alone.record["history"]):
        assert mine["train_loss"] == pytest.approx(its["train_loss"], rel=1e-5)
        assert mine["dev_main"] == pytest.approx(its["dev_main"], abs=1e-6)
    assert good.record["test"] == pytest.approx(alone.record["test"], abs=1e-6)


def test_a_setting_of_some_swept_methods_names_whose_it_is(capsys):
    from peltbench.cli import main

    with pytest.raises(SystemExit) as stop:
        import sys

        sys.argv = ["peltbench", "-m", "method=lora,ia3", "method.lora_rank=4,8", "task=rte", "--cfg", "job"]
        main()
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "peltbench: error: method.lora_rank: a setting of dora, lora, lora_fa, unipelt_apl, unipelt_apl_nogate, not of "
        "ia3: sweep the methods that have it apart from the others (-m method=lora method.lora_rank=...)")
