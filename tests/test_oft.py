"""OFT (methods/oft.py, on methods/rotation.py): its Cayley forms, its refusals, in groups, through peltbench, saved.
Against PEFT 0.21's OFT (logits, gradients, counts, the PEFT copy): tests/test_peft_matrix.py.

Tiny random encoders with O(1) weights (initializer_range 0.2: with 0.02 the attention scores are so small that a
missing path hides in the tolerance). Tolerances as tests/test_encoders.py: 1e-5 relative / 1e-6 absolute.
"""

from __future__ import annotations

import pytest
import torch

from peltbench.methods.oft import cayley, skew
from test_encoders import (assert_a_mixed_group_is_its_members_alone, assert_fused_as_alone, build, method, normal,
                           off_start, reloaded)

O1 = {"initializer_range": 0.2}


def skewed(model, scale: float = 0.3) -> None:
    """Non-identity rotations: random skew parameters where OFT starts at zero (R = I)."""
    off_start(model, 3, {"oft_R.weight": normal(scale)})


def test_cayley_neumann_is_peft_series_and_exact_is_orthogonal():
    """5 terms: I + 2Q + 2Q² + 2Q³ + Q⁴ (PEFT 0.21's `_cayley_batch`); 0: orthogonal (I − Q)(I + Q)⁻¹."""
    q = skew(0.1 * torch.randn(3, 6, generator=torch.Generator().manual_seed(0)), 4)
    eye = torch.eye(4).expand_as(q)
    torch.testing.assert_close(cayley(q, 5), eye + 2 * q + 2 * q @ q + 2 * q @ q @ q + q @ q @ q @ q)
    exact = cayley(q, 0)
    torch.testing.assert_close(exact @ exact.transpose(-1, -2), eye, rtol=0, atol=1e-6)
    torch.testing.assert_close(exact @ (eye + q), eye - q, rtol=0, atol=1e-6)


def test_block_size_must_divide_the_input_and_a_rotation_has_no_gate():
    with pytest.raises(ValueError, match="oft_block_size=5 must divide"):
        build("bert", method("oft", oft_block_size=5))
    with pytest.raises(ValueError, match="oft has no gate"):
        build("bert", method("oft", gated=True))


MIXED = [("oft", {"oft_block_size": 8}), ("lora", {}), ("oft", {"oft_block_size": 4, "oft_targets": ["key"]}),
         ("adapter", {}), ("oft", {"oft_block_size": 8, "oft_neumann_terms": 0}), ("prefix", {}), ("bitfit", {}),
         ("oft", {"components": ["oft", "bitfit"], "oft_block_size": 16})]  # OFT on a BitFit-tuned projection


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_with_oft_and_other_methods_computes_each_members_logits_and_gradients(model_type):
    """OFT members of several block sizes, targets and Cayley forms beside LoRA, adapters and prefixes on one shared
    backbone: each member's logits and gradients equal those of its own model."""
    # ‖Q‖ < 1 for b = 16 too: 0.3 makes its 5-term R far from orthogonal, with O(10) gradients
    assert_a_mixed_group_is_its_members_alone(model_type, MIXED, [lambda group: skewed(group, 0.1)], **O1)


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])  # every encoder: test_encoders.py's run test
def test_oft_runs_alone_and_fused_saves_and_reloads(model_type, tmp_path, glue_dir):
    """Through peltbench: OFT fused with LoRA gives its separate run's record; save.weights=true keeps the rotations,
    and load_run predicts what the run scored."""
    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    extra = ("method.oft_block_size=8", "method.lr=5e-2", "save.weights=true")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["oft"], False, *extra))
    fused = run_group(sweep(checkpoint, glue_dir, tmp_path / "fused", ["oft", "lora"], True, "save.weights=true",
                            "method.lr=5e-2")[1:] + sweep(checkpoint, glue_dir, tmp_path / "fused", ["oft"], True, *extra))
    assert_fused_as_alone(alone, fused, 2)
    assert alone.record["trainable_params"] == 2 * 4 * 28 * (1 if model_type == "modernbert" else 2)
    _, loaded = reloaded(tmp_path / "alone", alone)
    trained = [p for n, p in loaded.model.named_parameters() if n.endswith("oft_R.weight")]
    assert trained and all(p.abs().max() > 0 for p in trained)  # the rotations trained away from R = I, and came back
