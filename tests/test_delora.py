"""DeLoRA (methods/delora.py): on ModernBERT's Wqkv blocks against PEFT 0.21's DeLoRA layer, its bound, in fused
groups, under successive halving, through peltbench, saved and reloaded. Against PEFT's DeLoRA on BERT, RoBERTa,
ELECTRA and DeBERTa-v3 (logits, gradients, counts, export): rows delora-* of tests/test_peft_matrix.py.

Tiny random encoders with O(1) weights (initializer_range 0.2); B and λ moved off their start (B = 0 would hide every
norm) so that the normalisation, λ and the column norms of W all matter. Tolerances as tests/test_encoders.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_to_scale
from peltbench.methods import member_state
from peltbench.methods.delora import DeLoRALinear
from test_encoders import (assert_fused_as_alone, assert_members_equal_their_own_models,
                           assert_members_start_as_their_own_models, build, method, mixed_group, normal, off_start,
                           reloaded)

O1 = {"initializer_range": 0.2}
H = 32


def spread(model) -> None:
    """B non-zero and λ away from its start (each member and projection its own), so that the update matters."""
    off_start(model, 8, {"delora_B": normal(0.5), "delora_lambda": lambda p, g: p + torch.rand(p.shape, generator=g)})


@pytest.mark.parametrize("block", ["query", "value"])
def test_delora_on_modernbert_blocks_is_peft_delora_on_each_block(block):
    """ModernBERT's Wqkv: our delta on a row block equals PEFT's DeloraLinear on a Linear holding those rows of W (its
    column norms included), in output and in the gradients of A, B and λ."""
    pytest.importorskip("peft")
    from peft import DeloraConfig
    from peft.tuners.delora.layer import DeloraLinear

    ours = build("modernbert", method("delora"), **O1)
    spread(ours)
    fused = ours.layers[1].attn.Wqkv
    delta = getattr(fused, block)
    rows = delta.block
    linear = torch.nn.Linear(H, H, bias=False)
    with torch.no_grad():
        linear.weight.copy_(fused.base.weight[rows])
    theirs = DeloraLinear(linear, "default", DeloraConfig(r=8, delora_lambda=4.0, target_modules=["x"]), r=8,
                          delora_lambda=4.0)
    with torch.no_grad():
        theirs.delora_A["default"].copy_(delta.delora_A[0])
        theirs.delora_B["default"].copy_(delta.delora_B[0])
        theirs.delora_lambda["default"].copy_(delta.delora_lambda[0])
    torch.testing.assert_close(delta.w_norm, theirs.delora_w_norm["default"], rtol=1e-6, atol=1e-7)
    x = torch.randn(3, 7, H, generator=torch.Generator().manual_seed(1))
    mine = fused(x)[..., rows]
    reference = theirs(x)
    torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)
    assert (reference - linear(x)).abs().max() > 1e-2  # the update matters
    mine.square().sum().backward()
    reference.square().sum().backward()
    for ours_parameter, name in ((delta.delora_A, "delora_A"), (delta.delora_B, "delora_B"),
                                 (delta.delora_lambda, "delora_lambda")):
        assert_close_to_scale(ours_parameter.grad[0].reshape(-1), getattr(theirs, name)["default"].grad.reshape(-1),
                              msg=name)


def test_delora_starts_as_the_pretrained_model_and_its_update_is_bounded():
    """B = 0 at the start; with any A and B the paper's bound holds: ΔW = Σ_i (λ/r) b̂_i â_iᵀ diag(‖W‖_c), r terms of
    unit norm, so ‖ΔW diag(1/‖W‖_c)‖_F ≤ λ."""
    model = build("roberta", method("delora"), **O1)
    delta = model.layers[0].attention.self.value
    x = torch.randn(2, 5, H)
    torch.testing.assert_close(delta(x), delta.base(x), rtol=0, atol=0)
    spread(model)
    with torch.no_grad():
        change = delta(torch.eye(H)) - delta.base(torch.eye(H))  # rows: ΔW applied to each basis vector
        normalised = change / delta.w_norm[:, None]  # (ΔW diag(‖W‖_c))ᵀ with the column scale divided out
        assert torch.linalg.norm(normalised) <= delta.delora_lambda[0, 0] + 1e-5


MIXED = [("delora", {}), ("delora", {"delora_rank": 3, "delora_targets": ["key", "value"], "delora_lambda": 12.0}),
         ("road", {}), ("dora", {"lora_rank": 2}), ("vera", {"vera_rank": 16}), ("delora", {"delora_rank": 5})]


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_with_delora_and_other_methods_computes_each_members_logits_and_gradients(model_type):
    """DeLoRA members of several ranks, λ and targets beside RoAd, DoRA and VeRA on one backbone: each member's logits
    and gradients equal its own model's (a smaller rank padded to the group's: no gradient in the padding)."""
    from test_road import turned

    group, methods, seeds = mixed_group(model_type, MIXED, **O1)
    assert_members_start_as_their_own_models(model_type, group, methods, seeds, **O1)
    spread(group)
    turned(group)
    with torch.no_grad():  # B spread over its own rank only: the padding stays as the group holds it, zero
        for module in group.modules():
            if isinstance(module, DeLoRALinear):
                for slot in module.users:
                    module.delora_B[slot, :, methods[slot].delora_rank :] = 0
    assert_members_equal_their_own_models(model_type, group, methods, seeds, **O1)
    for module in group.modules():
        if isinstance(module, DeLoRALinear):
            for slot in module.users:
                rank = methods[slot].delora_rank
                assert not module.delora_A.grad[slot, rank:].any() and not module.delora_B.grad[slot, :, rank:].any()


@pytest.mark.parametrize("model_type", ["bert", "deberta-v2"])
def test_delora_runs_alone_and_fused_saves_and_reloads(model_type, tmp_path, glue_dir):
    """Through peltbench (dropout on): DeLoRA fused with RoAd and LoRA gives its separate run's record; save.weights=true
    keeps A, B, λ and writes peft/ (PEFT's DeloraConfig; that it loads and predicts: the matrix); load_run predicts what
    the run scored."""
    import json

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.1, **O1)  # alone = fused with dropout on
    extra = ("method.lr=5e-3", "save.weights=true")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["delora"], False, *extra))
    fused = run_group(sweep(checkpoint, glue_dir, tmp_path / "fused", ["road", "delora", "lora"], True, *extra))
    assert_fused_as_alone(alone, fused, 3)
    assert alone.record["trainable_params"] == 2 * 2 * (8 * H + H * 8 + 1)
    run_dir, loaded = reloaded(tmp_path / "alone", alone)
    config = json.loads((run_dir / "peft" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["delora_lambda"]) == ("DELORA", 8, 4.0)
    assert any(t.abs().max() > 0 for n, t in member_state(loaded.model, 0).items() if n.endswith("delora_B"))


def test_no_peft_copy_of_delora_on_modernbert():
    from peltbench.architectures import architecture
    from peltbench.saving import peft_kind

    assert peft_kind(method("delora"), architecture("roberta")) == ("DELORA", None)
    assert peft_kind(method("road"), architecture("modernbert")) == ("ROAD", None)
    kind, why = peft_kind(method("delora"), architecture("modernbert"))
    assert kind is None and "Wqkv" in why and "\n" not in why
