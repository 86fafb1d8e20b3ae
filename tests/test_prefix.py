"""P-tuning v2 (`prefix_projection: false`, methods/prefix.py) against the eager prefix reference of
tests/test_encoders.py; its position shift, count, config and identity. Against PEFT 0.21's
PrefixTuningConfig(prefix_projection=False) (on BERT, RoBERTa and ELECTRA: DeBERTa-v2 and ModernBERT take no
past_key_values), shifted positions as PEFT's and unshifted ones as PEFT's given position ids p - L, which it shifts
back (docs/protocol.md §4.18): tests/test_peft_matrix.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import compose_config
from peltbench import UserError
from peltbench.config import check_config
from peltbench.methods import count_method, member_state
from peltbench.record import config_hash
from test_encoders import (ARCHITECTURES, batch, build, method, model_inputs, reference_head,
                           reference_prefix_model)

O1 = {"initializer_range": 0.2}


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_the_position_shift_changes_the_logits_not_the_prefix(model_type):
    """prefix_shift_positions true (the authors' code, PEFT) and false (UniPELT's prefix) draw one prefix and number
    the tokens differently: other logits."""
    ours = build(model_type, method("ptuning_v2"), **O1)
    unshifted = build(model_type, method("ptuning_v2", prefix_shift_positions=False), **O1)
    prefix = member_state(ours, 0)["prefix_encoder.key_values"]
    torch.testing.assert_close(member_state(unshifted, 0)["prefix_encoder.key_values"], prefix)  # one draw
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        assert (unshifted(ids, mask, types) - ours(ids, mask, types)).abs().max() > 1e-2


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_ptuning_v2_equals_an_eager_reference_that_concatenates_the_prefix(model_type):
    """On every encoder (PEFT's prefix runs on BERT and RoBERTa only): DeBERTa with zero relative bias over the prefix,
    ModernBERT without rotating it; with the tokens' positions shifted by L where the encoder has absolute ones."""
    from peltbench.methods.prefix import shifted_positions

    for shift in (False, True):
        ours = build(model_type, method("ptuning_v2", prefix_shift_positions=shift))
        reference = reference_prefix_model(model_type, ours)
        reference_head(reference, ours)
        ids, mask, types = batch(model_type)
        inputs = model_inputs(model_type, ids, mask, types)
        positions = shifted_positions(ours.arch, ours.config, ids, torch.tensor([20]))
        if shift and positions is not None:
            inputs["position_ids"] = positions
        with torch.no_grad():
            torch.testing.assert_close(ours(ids, mask, types), reference(**inputs).logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_type", ["roberta", "bert"])
def test_a_fused_group_shifts_only_its_ptuning_members_positions(model_type):
    """A P-tuning v2 member (positions shifted), one with the shift off and a LoRA member in one group: each computes
    its own model's logits and gradients."""
    from test_encoders import assert_members_equal_their_own_models

    methods = [method("ptuning_v2"), method("ptuning_v2", prefix_shift_positions=False), method("lora")]
    seeds = [42, 43, 44]
    group = build(model_type, methods, seeds, **O1)
    assert_members_equal_their_own_models(model_type, group, methods, seeds, **O1)


def test_ptuning_v2_stores_and_trains_its_prefix_tensor_itself():
    """roberta-base's shape: L × 2 × layers × H = 20 × 2 × 12 × 768 = 368,640 stored, and it is all the optimiser
    updates besides the head (no MLP); its init is nn.Embedding's N(0, 1), as PEFT's and the authors' code draw it."""
    from transformers import AutoConfig

    counts = count_method(method("ptuning_v2"), AutoConfig.for_model("roberta", num_labels=2))
    assert counts["trainable_params"] == counts["optimizer_params"] - counts["head_params"] == 368_640
    prefix = member_state(build("bert", method("ptuning_v2")), 0)["prefix_encoder.key_values"]
    assert prefix.shape == (20, 128) and 0.8 < prefix.std() < 1.2


def test_prefix_projection_is_a_setting_of_prefix_that_keeps_old_identities(tmp_path):
    """prefix_projection=true is today's prefix (hash unchanged: record.LATER_METHOD_KEYS); false needs no MLP
    width, and one given is refused in one line."""
    plain = compose_config("method=prefix", "task=rte")
    explicit = compose_config("method=prefix", "task=rte", "+method.prefix_projection=true")
    assert config_hash(plain) == config_hash(explicit)
    direct = compose_config("method=prefix", "task=rte", "+method.prefix_projection=false", "~method.prefix_hidden")
    check_config(direct)
    assert config_hash(direct) != config_hash(plain)
    with pytest.raises(UserError, match=r"^method.prefix_hidden: the MLP's width, but prefix_projection=false"):
        check_config(compose_config("method=ptuning_v2", "task=rte", "+method.prefix_hidden=512"))


def test_a_saved_ptuning_v2_run_reloads_and_says_why_it_writes_no_peft_copy(tmp_path, glue_dir, caplog):
    """weights.safetensors rebuilds the run (load_run); no peft/, and one log line says why (PEFT shifts positions)."""
    import logging

    import peltbench
    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder("roberta", tmp_path / "ckpt", dropout=0.0, **O1)
    with caplog.at_level(logging.INFO, logger="peltbench"):
        [outcome] = run_group(sweep(checkpoint, glue_dir, tmp_path / "runs", ["ptuning_v2"], False, "save.weights=true",
                                    "train.epochs=2"))
    assert outcome.status == "ok" and outcome.record["saved"] == ["weights.safetensors"]
    assert [r.message for r in caplog.records if "no peft/ copy" in r.message][0].endswith(
        "no peft/ copy: peltbench writes no PEFT copy of a prefix run (a P-tuning v2 run with shifted positions "
        "computes what PEFT's prefix tuning computes on BERT and RoBERTa, but its export is not implemented: "
        "docs/saving.md)")
    run_dir = next((tmp_path / "runs").rglob("result.json")).parent
    assert peltbench.load_run(run_dir).predict()[0] == pytest.approx(outcome.record["test"], abs=1e-9)
