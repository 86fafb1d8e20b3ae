"""HRA (methods/hra.py, on methods/rotation.py): its init, in groups, through peltbench, saved. Against PEFT 0.21's
HRA (logits, gradients, counts, the PEFT copy): tests/test_peft_matrix.py.

Tiny random encoders with O(1) weights (initializer_range 0.2). Tolerances as tests/test_encoders.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_encoder
from peltbench.methods import member_state
from peltbench.methods.hra import reflections
from test_encoders import (assert_a_mixed_group_is_its_members_alone, assert_fused_as_alone, batch, build, method,
                           model_inputs, normal, off_start, reloaded)
from test_oft import O1


def unpaired(model) -> None:
    """Non-identity products: the paired columns of PEFT's init (H_i H_i = I) replaced by independent ones."""
    off_start(model, 4, {"hra_u.weight": normal(1.0)})


def test_hra_starts_as_the_identity_and_its_init_is_peft_symmetric_one():
    """r even: columns drawn in pairs (u_1 = u_2, ...), so R = I and the model is the pretrained one."""
    model = build("roberta", method("hra"), **O1)
    u = member_state(model, 0)["roberta.encoder.layer.0.attention.self.query.hra_u.weight"]
    assert u.shape == (32, 8) and torch.equal(u[:, 0::2], u[:, 1::2]) and u.abs().max() <= 1 / 2  # kaiming: 1/√(r/2)
    torch.testing.assert_close(reflections(u[None], False)[0], torch.eye(32), rtol=0, atol=1e-6)
    ids, mask, types = batch("roberta")
    with torch.no_grad():
        plain = tiny_encoder("roberta", dropout=0.0, **O1)(**model_inputs("roberta", ids, mask, types)).logits
        torch.testing.assert_close(model(ids, mask, types), plain, rtol=1e-5, atol=1e-6)


MIXED = [("hra", {"hra_rank": 4}), ("oft", {"oft_block_size": 8}), ("hra", {"hra_rank": 2, "hra_targets": ["key"]}),
         ("lora", {}), ("hra", {"hra_rank": 4, "hra_apply_gs": True})]


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_with_hra_and_other_methods_computes_each_members_logits_and_gradients(model_type):
    """HRA members of several ranks and targets beside OFT and LoRA on one shared backbone: each member's logits
    and gradients equal those of its own model."""
    from test_oft import skewed

    assert_a_mixed_group_is_its_members_alone(model_type, MIXED, [unpaired, skewed], **O1)


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_hra_runs_alone_and_fused_saves_and_reloads(model_type, tmp_path, glue_dir):
    """Through peltbench: HRA fused with OFT gives its separate run's record; save.weights=true keeps the reflection
    vectors, load_run predicts what the run scored, and the reflections trained."""
    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import reference_head, sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    extra = ("method.lr=5e-2", "save.weights=true")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["hra"], False, *extra))
    fused = run_group(sweep(checkpoint, glue_dir, tmp_path / "fused", ["oft", "hra"], True, *extra))
    assert_fused_as_alone(alone, fused, 2)
    assert alone.record["trainable_params"] == 2 * 32 * 8 * (1 if model_type == "modernbert" else 2)
    _, loaded = reloaded(tmp_path / "alone", alone)
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        logits = loaded.model(ids, mask, types)
        plain = tiny_encoder(model_type, dropout=0.0, **O1)
        reference_head(plain, loaded.model)  # the trained head, so only the reflections can differ from here
        assert (plain(**model_inputs(model_type, ids, mask, types)).logits - logits).abs().max() > 1e-4  # trained
