"""LoRA-FA (lora_freeze_a): LoRA with A frozen at its random init, against PEFT's (peft/optimizers/lorafa.py freezes
lora_A), on every encoder; and the setting's place in a record's identity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, tiny_encoder
from peltbench.methods import count_method, member_frozen, member_state, parameter_counts
from peltbench.record import config_hash
from test_encoders import ARCHITECTURES, batch, build, method, model_inputs, peft_lora, randomise

O1 = {"initializer_range": 0.2}


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_lora_fa_equals_peft_with_a_frozen(model_type, monkeypatch):
    """Logits and B's gradients equal PEFT's LoRA with lora_A frozen; A gets no gradient and is not counted."""
    pytest.importorskip("peft")
    import test_encoders

    config = method("lora_fa")
    monkeypatch.setattr(test_encoders, "tiny_encoder", lambda *args, **changes: tiny_encoder(*args, **{**changes, **O1}))
    monkeypatch.setattr(test_encoders, "member_state",  # the frozen A too, which is what a PEFT copy needs (saving.py)
                        lambda model, slot: {**member_state(model, slot), **member_frozen(model, slot, config)})
    ours = build(model_type, config, **O1)
    randomise(ours)
    peft = peft_lora(model_type, ours).train()
    for name, parameter in peft.named_parameters():
        if "lora_A" in name:
            parameter.requires_grad_(False)  # what PEFT's LoRA-FA optimizer does
    ours.train()
    ids, mask, types = batch(model_type)
    logits = ours(ids, mask, types)
    peft_logits = peft(**model_inputs(model_type, ids, mask, types)).logits
    torch.testing.assert_close(logits, peft_logits, rtol=1e-5, atol=1e-6)
    labels = torch.tensor([0, 1, 1])
    F.cross_entropy(logits, labels).backward()
    F.cross_entropy(peft_logits, labels).backward()
    ours_b = [p.grad[0] for n, p in ours.named_parameters() if n.endswith("lora_b.weight")]
    peft_b = [p.grad for n, p in peft.named_parameters() if "lora_B" in n]
    assert all(p.grad is None for n, p in ours.named_parameters() if n.endswith("lora_a.weight"))
    if model_type == "modernbert":  # PEFT's one rank-16 B on Wqkv holds ours in its q and v blocks
        peft_b = [part for b in peft_b for part in (b[:32, :8], b[64:, 8:])]
    for grad, reference in zip(ours_b, peft_b, strict=True):
        torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6)
    assert parameter_counts(ours)["trainable_params"] == sum(g.numel() for g in ours_b) == 2 * 2 * 8 * 32


def test_lora_fa_count_on_roberta_base_and_deberta_v3_base_shapes():
    """ECOSYSTEM.md (PEFT on roberta-base): 147,456 = 12 · 2 · 768 · 8."""
    from transformers import AutoConfig

    assert count_method(method("lora_fa"), AutoConfig.for_model("roberta"))["trainable_params"] == 147_456
    deberta = AutoConfig.for_model("deberta-v2", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                   intermediate_size=3072, relative_attention=True, share_att_key=True,
                                   pos_att_type=["p2c", "c2p"], position_buckets=256, vocab_size=128100)
    assert count_method(method("lora_fa"), deberta)["trainable_params"] == 147_456


def test_lora_freeze_a_false_keeps_a_lora_records_identity():
    plain = compose_config("method=lora", "task=rte")
    assert config_hash(compose_config("method=lora", "task=rte", "+method.lora_freeze_a=false")) == config_hash(plain)
    assert config_hash(compose_config("method=lora", "task=rte", "+method.lora_freeze_a=true")) != config_hash(plain)
