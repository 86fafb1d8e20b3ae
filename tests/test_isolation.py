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
    (("method=boft", "method.components=[boft,bitfit]"),  # issue 32, 5: refused once the model had loaded
     "method.components=[boft,bitfit]: boft with bitfit: boft_s scales W x around the frozen bias, which bitfit would"),
    (("method=dora", "method.components=[lora,dora]"), "method.components=[lora,dora]: dora with lora: dora rescales"),
])
def test_what_the_config_tells_is_refused_before_torch(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_config(compose_config("task=rte", *overrides))


def _component_settings() -> dict:
    """Per component, its settings as the first packaged method file that lists it has them."""
    from peltbench.component import declaration
    from peltbench.packaged import options, packaged_config

    found = {}
    for name in options("method"):
        method = packaged_config(f"method/{name}.yaml")
        for component in method.components:
            settings = declaration(component).all_settings()
            found.setdefault(component, {key: method[key] for key in settings if key in method})
    return found


def test_the_components_refused_together_before_torch_are_those_the_methods_refuse():
    """The check before torch (config) and the methods' own checks at build time refuse the same pairs of components,
    each pair in a method whose settings are otherwise valid (issue 32, 5: [boft,bitfit] was refused only once the
    model had loaded)."""
    from itertools import combinations

    from omegaconf import OmegaConf

    from peltbench import config, methods
    from peltbench.component import declaration

    settings = _component_settings()
    for pair in combinations(sorted(settings), 2):
        method = OmegaConf.create({"name": "pair", "components": list(pair), "head": "train", "lr": 1e-4,
                                   **settings[pair[0]], **settings[pair[1]], "gated": False})
        if not any(declaration(c).gate for c in pair):
            del method["gated"]  # a setting no component of the pair reads is refused on its own
        try:
            config.check_method(method)
            before = None
        except UserError as error:
            before = str(error)
        try:
            methods.check_method(method)
            after = None
        except ValueError as error:
            after = str(error)
        assert (before is None) == (after is None), (pair, before, after)


def test_a_gate_setting_belongs_to_exactly_the_components_that_have_a_gate():
    """A component reads `gated` (and gate_pooling) exactly where its declaration says what its gate multiplies; the
    module that runs holds the very declaration the check before torch read."""
    from peltbench.component import declaration
    from peltbench.methods import COMPONENTS

    for name, module in COMPONENTS.items():
        assert ("gated" in declaration(name).all_settings()) == (declaration(name).gate is not None), name
        assert module.COMPONENT == declaration(name), name


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


NO_ROOM = ("method=prompt task=rte: prompt_length 600 positions come before the text, but the model has 128 "
           "(max_position_embeddings): none left for the text (a row takes at least 3); lower method.prompt_length")


def test_a_prompt_that_alone_fills_the_position_table_is_refused_before_torch(tiny_checkpoint):
    """Issue 32, 5: it was found once the rows were tokenised, and advised `set train.max_length=-88 or lower`."""
    from peltbench.config import ModelMisfit, check_model_fit

    with pytest.raises(ModelMisfit, match=re.escape(NO_ROOM)):
        check_config(compose_config("method=prompt", "task=rte", f"model.name={tiny_checkpoint}",
                                    "method.prompt_length=600"))
    check_config(compose_config("method=prompt", "task=rte", f"model.name={tiny_checkpoint}",
                                "method.prompt_length=125"))  # 3 positions left: whether the rows fit, they tell
    roberta = {"model_type": "roberta", "pad_token_id": 1, "max_position_embeddings": 514}
    with pytest.raises(ModelMisfit, match=re.escape("prompt_length 511 + RoBERTa's offset 2 = 513 positions come "
                                                    "before the text, but the model has 514 (max_position_embeddings): "
                                                    "only 1 left for the text")):
        check_model_fit(compose_config("method=prompt", "task=rte", "method.prompt_length=511"), roberta)
    with pytest.raises(ModelMisfit, match=re.escape("prefix_length (its positions come first) 600 + RoBERTa's offset "
                                                    "2 = 602 positions come before the text")):
        check_model_fit(compose_config("method=ptuning_v2", "task=rte", "method.prefix_length=600"), roberta)


def test_a_hub_models_config_json_in_the_hugging_face_cache_is_checked_before_torch(tiny_checkpoint, tmp_path,
                                                                                    monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--someone--tiny-bert" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    (tmp_path / "hub" / "models--someone--tiny-bert" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny-bert" / "refs" / "main").write_text("0123abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(UserError, match=re.escape(NO_ROOM)):
        check_config(compose_config("method=prompt", "task=rte", "model.name=someone/tiny-bert",
                                    "method.prompt_length=600"))
    check_config(compose_config("method=prompt", "task=rte", "model.name=someone/uncached", "method.prompt_length=600"))


def test_a_sweep_with_one_such_member_is_one_line_before_torch(tmp_path, tiny_checkpoint):
    import subprocess
    import sys

    script = ("import sys; from peltbench.cli import main\n"
              "sys.argv = ['peltbench', *sys.argv[1:]]\n"
              "try:\n    main()\nexcept SystemExit as exit:\n"
              "    print(exit.code, sorted({'torch', 'transformers'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script, "-m", "method=prompt", "method.prompt_length=20,600",
                             "task=rte", f"model.name={tiny_checkpoint}"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout == "2 []\n", result.stdout + result.stderr
    assert result.stderr == f"peltbench: error: {NO_ROOM}\n"
    assert list(tmp_path.iterdir()) == []  # nothing started


def test_a_member_whose_rows_do_not_fit_its_model_writes_a_failed_record_with_its_reason(tiny_checkpoint, glue_dir,
                                                                                       tmp_path):
    """What only the run's tokenised rows tell (here: 3 positions left after the prompt) fails that run with a record
    that says why, as any failure once a run has started (issue 32, 5: it left no record, only a "missing" line)."""
    from peltbench.record import record_path
    from peltbench.runner import run_group

    cfg = compose_config("method=prompt", "task=rte", "method.prompt_length=125", "logger=[]",
                         *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path))
    [outcome] = run_group([cfg])
    record = json.loads(record_path(cfg, tmp_path).read_text())
    assert outcome.status == "failed" and record["status"] == "failed"
    assert re.fullmatch(r"method=prompt task=rte: the longest row's \d+ tokens \+ prompt_length 125 = \d+ positions, "
                        r"but the model has 128 \(max_position_embeddings\): set train.max_length=3 or lower",
                        record["error"]), record["error"]
    assert not (record_path(cfg, tmp_path).parent / "claim.json").exists()


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
