"""P-tuning v2 (`prefix_projection: false`, methods/prefix.py) against PEFT 0.21's PrefixTuningConfig(prefix_projection=
False) and the eager prefix reference of tests/test_encoders.py; its count, config and identity.

PEFT's prefix tuning runs on BERT and RoBERTa only (DeBERTa-v2 and ModernBERT take no past_key_values), and there it
shifts every position id by the prefix length L (docs/protocol.md §4.18); given position ids p - L it adds L back, so
it computes exactly our prefix, which is what the comparison passes. On every encoder the eager reference (which
concatenates the prefix in front of each layer's keys and values) checks the same arithmetic.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, tiny_encoder
from peltbench import UserError
from peltbench.config import check_config
from peltbench.methods import count_method, member_state, parameter_counts
from peltbench.record import config_hash
from test_encoders import (ARCHITECTURES, batch, build, method, model_inputs, reference_head,
                           reference_prefix_model)

O1 = {"initializer_range": 0.2}


def unshifted_positions(model_type: str, ids: torch.Tensor, pad: int, length: int) -> torch.Tensor:
    """The position ids the model computes itself, minus L: PEFT's prefix adds L to the ids it is given."""
    if model_type == "roberta":
        from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

        return RobertaEmbeddings.create_position_ids_from_input_ids(ids, pad) - length
    return torch.arange(ids.shape[1]).expand_as(ids) - length


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_ptuning_v2_equals_peft(model_type):
    """By default (`prefix_shift_positions: true`, the authors' code) the tokens' positions follow the prefix: logits,
    the prefix's gradient and the count equal PEFT's P-tuning v2 as PEFT runs it. With the shift off (UniPELT's prefix,
    and ptuning_v2 before the setting) it equals PEFT given position ids p - L (which PEFT shifts back), and differs."""
    pytest.importorskip("peft")
    from peft import PrefixTuningConfig, get_peft_model

    ours = build(model_type, method("ptuning_v2"), **O1).train()
    unshifted = build(model_type, method("ptuning_v2", prefix_shift_positions=False), **O1).train()
    base = tiny_encoder(model_type, dropout=0.0, **O1)
    peft = get_peft_model(base, PrefixTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=20,
                                                   prefix_projection=False)).train()
    embedding = peft.prompt_encoder["default"].embedding.weight
    prefix = member_state(ours, 0)["prefix_encoder.key_values"]
    torch.testing.assert_close(member_state(unshifted, 0)["prefix_encoder.key_values"], prefix)  # one draw
    with torch.no_grad():
        embedding.copy_(prefix)
    ids, mask, types = batch(model_type)
    labels = torch.tensor([0, 1, 1])
    logits = ours(ids, mask, types)
    peft_logits = peft(**model_inputs(model_type, ids, mask, types)).logits
    torch.testing.assert_close(logits, peft_logits, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        positions = unshifted_positions(model_type, ids, base.config.pad_token_id, 20)
        torch.testing.assert_close(unshifted(ids, mask, types),
                                   peft(**model_inputs(model_type, ids, mask, types), position_ids=positions).logits,
                                   rtol=1e-5, atol=1e-6)
        assert (unshifted(ids, mask, types) - logits).abs().max() > 1e-2
    F.cross_entropy(logits, labels).backward()
    F.cross_entropy(peft_logits, labels).backward()
    [(name, parameter)] = [(n, p) for n, p, _, _ in ours.member_parameters() if n.startswith("prefix_encoder.")]
    torch.testing.assert_close(parameter.grad[0], embedding.grad, rtol=1e-5, atol=1e-6)
    assert parameter_counts(ours)["trainable_params"] == embedding.numel() == 20 * 2 * 2 * 32


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_ptuning_v2_equals_an_eager_reference_that_concatenates_the_prefix(model_type):
    """On every encoder (PEFT's prefix runs on BERT and RoBERTa only): DeBERTa with zero relative bias over the prefix,
    ModernBERT without rotating it; with the tokens' positions shifted by L where the encoder has absolute ones."""
    from peltbench.methods.base import shifted_positions

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
