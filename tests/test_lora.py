"""LoRA-FA (lora_freeze_a): the setting's place in a record's identity. Against PEFT's LoRA with lora_A frozen
(peft/optimizers/lorafa.py) on every encoder (logits, B's gradients, A's none, counts, the PEFT copy with A):
tests/test_peft_matrix.py."""

from __future__ import annotations

from conftest import compose_config
from peltbench.record import config_hash


def test_lora_freeze_a_false_keeps_a_lora_records_identity():
    plain = compose_config("method=lora", "task=rte")
    assert config_hash(compose_config("method=lora", "task=rte", "+method.lora_freeze_a=false")) == config_hash(plain)
    assert config_hash(compose_config("method=lora", "task=rte", "+method.lora_freeze_a=true")) != config_hash(plain)
