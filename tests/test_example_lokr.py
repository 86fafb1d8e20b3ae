"""examples/lokr: LoKr written as a researcher writes a component, outside peltbench (issue 45, item 5), against
PEFT 0.21's LoKr as tests/test_peft_matrix.py holds the built-ins to PEFT: the same logits, loss and gradients from
the same tensors on every tiny encoder PEFT adapts alike, the same count, an export PEFT loads; and trained alone and
fused with a built-in (LoRA), one record."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import REPO, assert_close_to_scale, assert_trained_alike, compose_config, tiny_encoder, tiny_run_overrides
from peltbench.methods import build_pelt_model, count_method

pytest.importorskip("peft")
from peft import LoKrConfig, PeftModel, get_peft_model  # noqa: E402
from peft.utils import set_peft_model_state_dict  # noqa: E402
from test_peft_matrix import CLOSE, QV, export, logits_of, move_off_init  # noqa: E402

EXAMPLE = REPO / "examples" / "lokr"
LABELS = torch.tensor([0, 1, 1])
# PEFT adapts ModernBERT's fused Wqkv whole, with one Kronecker product of its 3H × H: not LoKr on the q and v blocks
SAME_AS_PEFT = ("bert", "roberta", "electra", "deberta-v2")


@pytest.fixture
def lokr(monkeypatch):
    """`lokr(**changes)`: the example's method file (examples/lokr/conf/method/lokr.yaml), its package on the path
    (PYTHONPATH=examples/lokr, as the README runs it) for this test only."""
    from peltbench import component

    def forget() -> None:
        for name in [name for name in sys.modules if name.split(".")[0] == "mylab"]:
            del sys.modules[name]
        component.declaration.cache_clear()
        component.code_identity.cache_clear()
        component.source_identity.cache_clear()

    forget()
    monkeypatch.syspath_prepend(str(EXAMPLE))

    def method(**changes):
        config = OmegaConf.load(EXAMPLE / "conf" / "method" / "lokr.yaml")
        for key, value in changes.items():
            config[key] = value
        return config

    yield method
    forget()


def batch(model_type: str) -> dict:
    from conftest import tiny_tokenizer

    pairs = (["the cat sat on the mat with a big dog", "a dog ran", "good movie"],
             ["it was very good", "the man runs", "not a sad film and not a happy one"])
    encoded = tiny_tokenizer(model_type)(*pairs, padding=True, return_tensors="pt")
    return {name: encoded[name] for name in ("input_ids", "attention_mask", "token_type_ids") if name in encoded}


@pytest.mark.parametrize("rank", [2, 8])  # hidden 32 = 4 · 8: W2 as W2a W2b (2 < 8/2), and whole (8 ≥ 8/2)
@pytest.mark.parametrize("model_type", SAME_AS_PEFT)
def test_lokr_is_pefts_lokr(model_type, rank, lokr):
    method = lokr(lokr_rank=rank, lokr_alpha=4.0)
    base, inputs = tiny_encoder(model_type, dropout=0.0), batch(model_type)
    ours = build_pelt_model(copy.deepcopy(base), method, 42)
    with torch.no_grad():  # W1 = 0: the model starts as the pretrained one
        torch.testing.assert_close(logits_of(ours, inputs), base(**inputs).logits, **CLOSE)
    move_off_init(ours, 0.3)
    peft_model = get_peft_model(copy.deepcopy(base), LoKrConfig(r=rank, alpha=4.0, target_modules=QV[model_type],
                                                                 task_type="SEQ_CLS"))
    trained = {ours.stored_name(name): (parameter, stacked) for name, parameter, _, stacked in ours.member_parameters()}
    state = {f"base_model.model.{name}": (parameter[0] if stacked else parameter).detach()
             for name, (parameter, stacked) in trained.items()}  # the head too (PEFT's modules_to_save)
    ours_named = {name: value for name, value in trained.items() if ".lokr_" in name}
    loaded = set_peft_model_state_dict(peft_model, state)
    assert not loaded.unexpected_keys
    logits, theirs = logits_of(ours, inputs), peft_model(**inputs).logits
    torch.testing.assert_close(logits, theirs, **CLOSE)
    assert (logits - base(**inputs).logits).abs().max() > 1e-2  # the method matters
    F.cross_entropy(logits, LABELS).backward()
    F.cross_entropy(theirs, LABELS).backward()
    peft_parameters = {name.removeprefix("base_model.model.").replace(".default", ""): parameter
                       for name, parameter in peft_model.named_parameters() if parameter.requires_grad}
    lokr_names = {name for name in peft_parameters if ".lokr_" in name}
    assert lokr_names == set(ours_named)  # PEFT trains what we train (W1, W2 or W2a and W2b), under our names
    for name in lokr_names:
        parameter, stacked = ours_named[name]
        assert_close_to_scale(parameter.grad[0] if stacked else parameter.grad, peft_parameters[name].grad, msg=name)
    assert count_method(method, base.config)["trainable_params"] == sum(peft_parameters[n].numel() for n in lokr_names)


def test_lokrs_copy_loads_in_peft_and_predicts_as_ours(lokr, tmp_path):
    base, inputs = tiny_encoder("bert", dropout=0.0), batch("bert")
    method = lokr(lokr_rank=2)
    ours = build_pelt_model(copy.deepcopy(base), method, 42)
    move_off_init(ours, 0.3, head=True)
    export(ours, method, compose_config("method=lora", "task=rte", "model.name=tiny"), tmp_path / "run")
    copied = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "run" / "peft").eval()
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(copied(**inputs).logits, logits_of(ours, inputs), **CLOSE)


def test_lokr_on_modernberts_fused_projection_trains_and_says_why_it_has_no_peft_copy(lokr, tmp_path, caplog):
    base, inputs = tiny_encoder("modernbert", dropout=0.0), batch("modernbert")
    method = lokr(lokr_rank=2)
    ours = build_pelt_model(copy.deepcopy(base), method, 42)
    move_off_init(ours, 0.3)
    F.cross_entropy(logits_of(ours, inputs), LABELS).backward()
    assert all(parameter.grad is not None for _, parameter, _, _ in ours.member_parameters())
    with caplog.at_level("INFO", logger="peltbench"):
        assert export(ours, method, compose_config("method=lora", "task=rte", "model.name=tiny"), tmp_path / "run") \
            is None
    assert any("PEFT's LoKr adapts ModernBERT's whole fused Wqkv" in record.message for record in caplog.records)


def test_lokr_fused_with_lora_writes_the_record_it_writes_alone(lokr, tiny_checkpoint, glue_dir, tmp_path):
    """Dropout on (the tiny checkpoint's 0.1): the LoKr member of a group with a LoRA run is its run alone."""
    from peltbench.runner import run_group

    def cfg(name: str, results: str):
        config = compose_config("method=lora", "task=rte", "fuse=true",
                                *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path / results))
        if name == "lokr":
            config.method = lokr(lokr_rank=2, lr=5.0e-3)
        return config

    [alone] = run_group([cfg("lokr", "alone")])
    together, lora = run_group([cfg("lokr", "fused"), cfg("lora", "fused")])
    assert alone.status == together.status == lora.status == "ok"
    assert together.record["fused"]["size"] == 2
    assert together.record["identity"]["code"]["mylab.lokr"].startswith("code ")
    assert_trained_alike(alone.record, together.record, "lokr")
    assert together.record["history"][0]["train_loss"] != together.record["history"][-1]["train_loss"]
