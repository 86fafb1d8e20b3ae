"""BOFT (methods/boft.py, on methods/rotation.py): its refusals, in groups, through peltbench, saved. Against PEFT
0.21's BOFT with m = 2 and m = 1 (logits, gradients, counts, the PEFT copy; PEFT's m > 1 needs its CUDA extension,
which the matrix stands in for): tests/test_peft_matrix.py.

Tiny encoders with O(1) weights, tolerances as test_encoders.
"""

from __future__ import annotations

import pytest

from test_encoders import (assert_a_mixed_group_is_its_members_alone, assert_fused_as_alone, build, method, normal,
                           off_start, reloaded)
from test_oft import O1


def randomised(model, scale: float = 0.3) -> None:
    """Non-identity rotations and scales: R random, s around 1."""
    off_start(model, 5, {"boft_R.weight": normal(scale), "boft_R.scale": normal(0.2, mean=1)})


def test_a_block_size_that_does_not_fit_and_bitfit_inside_are_refused():
    with pytest.raises(ValueError, match="boft_block_size=12 with boft_factors=2 does not fit"):
        build("bert", method("boft", boft_block_size=12))
    with pytest.raises(ValueError, match="boft with bitfit"):
        build("bert", method("boft", components=["boft", "bitfit"]))


MIXED = [("boft", {"boft_block_size": 4}), ("oft", {"oft_block_size": 8}), ("bitfit", {}),
         ("boft", {"boft_block_size": 2, "boft_factors": 3, "boft_targets": ["key"]}), ("lora", {}), ("hra", {})]


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_with_boft_and_other_methods_computes_each_members_logits_and_gradients(model_type):
    """BOFT members of several shapes beside OFT, HRA, BitFit and LoRA on one shared backbone: each member's logits
    and gradients equal those of its own model."""
    assert_a_mixed_group_is_its_members_alone(model_type, MIXED, [randomised], **O1)


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_boft_runs_alone_and_fused_saves_and_reloads(model_type, tmp_path, glue_dir):
    """Through peltbench: BOFT fused with HRA gives its separate run's record; save.weights=true keeps R and s, and
    load_run predicts what the run scored."""
    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    extra = ("method.lr=5e-2", "save.weights=true")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["boft"], False, *extra))
    fused = run_group(sweep(checkpoint, glue_dir, tmp_path / "fused", ["hra", "boft"], True, *extra))
    assert_fused_as_alone(alone, fused, 2)
    _, loaded = reloaded(tmp_path / "alone", alone)
    trained = [p for n, p in loaded.model.named_parameters() if n.endswith("boft_R.scale")]
    assert trained and all((p - 1).abs().max() > 0 for p in trained)
