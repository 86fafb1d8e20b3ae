"""BOFT (methods/boft.py, on methods/rotation.py) against PEFT 0.21's BOFT, in groups, through peltbench, exported.

PEFT computes m > 1 butterfly factors only with its CUDA block-diagonal extension; without it (this machine) it
silently sets m = 1. `cuda_block_diag` stands in for the extension with what it computes (torch.block_diag of each
factor's blocks), so PEFT's m = 2 path runs on a CPU. Tiny encoders with O(1) weights, tolerances as test_encoders.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import tiny_encoder
from peltbench.methods import build_pelt_model, member_state, parameter_counts
from test_encoders import (assert_members_equal_their_own_models, batch, build, method,
                           model_inputs, same_logits_then_backward)
from test_oft import ARCHITECTURES, O1, PEFT_TARGETS


@pytest.fixture
def cuda_block_diag(monkeypatch):
    """PEFT's FastBlockDiag without CUDA: (N, D, b, b) → (N, D·b, D·b), the blocks on the diagonal."""
    pytest.importorskip("peft")
    import peft.tuners.boft.layer as layer

    class BlockDiag:
        @staticmethod
        def apply(blocks):
            return torch.stack([torch.block_diag(*factor) for factor in blocks])

    monkeypatch.setattr(layer, "get_fbd_cuda", lambda: True)
    monkeypatch.setattr(layer, "FastBlockDiag", BlockDiag)


def randomised(model, scale: float = 0.3) -> None:
    """Non-identity rotations and scales: R random, s around 1."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("boft_R.weight"):
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
            elif name.endswith("boft_R.scale"):
                parameter.copy_(1 + 0.2 * torch.randn(parameter.shape, generator=generator))


def biased(model_type: str):
    """A tiny encoder whose biases are not zero (HF starts them at 0): s scales W x around the bias, not the bias."""
    model = tiny_encoder(model_type, dropout=0.0, **O1)
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return model


def peft_boft(model_type: str, ours, factors: int, base):
    from peft import BOFTConfig, get_peft_model

    config = BOFTConfig(boft_block_size=4, boft_n_butterfly_factor=factors, target_modules=PEFT_TARGETS[model_type],
                        task_type="SEQ_CLS")
    peft = get_peft_model(copy.deepcopy(base), config)
    state = member_state(ours, 0)
    with torch.no_grad():
        for name, parameter in peft.named_parameters():
            for theirs, mine in ((".boft_R.default", ".boft_R.weight"), (".boft_s.default", ".boft_R.scale")):
                if name.endswith(theirs):
                    parameter.copy_(state[name.removeprefix("base_model.model.").replace(theirs, mine)])
    return peft


@pytest.mark.parametrize("factors", [2, 1])
@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_boft_equals_peft(model_type, factors, cuda_block_diag):
    """Logits, gradients of every trained tensor (R, s, head) and the count equal PEFT's BOFT (b = 4)."""
    base = biased(model_type)
    ours = build_pelt_model(copy.deepcopy(base), method("boft", boft_block_size=4, boft_factors=factors), 42, [base])
    randomised(ours)
    peft = peft_boft(model_type, ours, factors, base).train()
    assert next(p for n, p in peft.named_parameters() if ".boft_R." in n).shape[0] == factors  # PEFT's m, not 1
    ours.train()
    grads = same_logits_then_backward(model_type, ours, peft, base)
    peft_grads = {n.removeprefix("base_model.model.").replace(".boft_R.default", ".boft_R.weight")
                  .replace(".boft_s.default", ".boft_R.scale").replace(".default", "").replace(".modules_to_save", ""):
                  p.grad for n, p in peft.named_parameters() if p.requires_grad}
    extra = {"pooler.dense.weight", "pooler.dense.bias"} if model_type == "deberta-v2" else set()  # see test_oft
    assert set(grads) - set(peft_grads) == extra and set(peft_grads) <= set(grads)
    for name, grad in peft_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    stored = sum(p.numel() for n, p in peft.named_parameters() if ".boft_" in n)
    linears, outputs = (2, 96) if model_type == "modernbert" else (4, 32)
    assert parameter_counts(ours)["trainable_params"] == stored == \
        linears * (factors * 8 * 4 * 4) + (2 if model_type == "modernbert" else 4) * outputs


def test_roberta_base_count():
    """BOFT(m = 2, b = 8) on q, v of roberta-base: 24 · (2 · 96 · 8 · 8 + 768) = 313,344. PEFT reports 165,888 on a
    machine without its CUDA extension: m = 1 there, 24 · (96 · 64 + 768) (ECOSYSTEM.md's number)."""
    from transformers import AutoConfig

    from peltbench.methods import count_method

    config = AutoConfig.for_model("roberta")
    assert count_method(method("boft"), config)["trainable_params"] == 313_344
    assert count_method(method("boft", boft_factors=1), config)["trainable_params"] == 165_888


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
    methods = [method(name, **changes) for name, changes in MIXED]
    seeds = [42 + i for i in range(len(methods))]
    group = build(model_type, methods, seeds, **O1)
    randomised(group)
    assert_members_equal_their_own_models(model_type, group, methods, seeds, **O1)


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_boft_runs_alone_and_fused_saves_reloads_and_loads_in_peft(model_type, tmp_path, glue_dir, cuda_block_diag):
    """Through peltbench: BOFT fused with HRA gives its separate run's record; save.weights=true keeps R and s,
    load_run predicts what the run scored, and peft/ loads in PEFT (with its CUDA path) with the same logits."""
    import peltbench
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    extra = ("method.lr=5e-2", "save.weights=true")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["boft"], False, *extra))
    fused = run_group(sweep(checkpoint, glue_dir, tmp_path / "fused", ["hra", "boft"], True, *extra))
    assert [o.status for o in [alone, *fused]] == ["ok"] * 3 and fused[1].record["fused"]["size"] == 2
    for key in ("train_loss", "dev_main"):
        assert [h[key] for h in alone.record["history"]] == \
            pytest.approx([h[key] for h in fused[1].record["history"]], rel=1e-5, abs=1e-6), key
    run_dir = next((tmp_path / "alone").rglob("result.json")).parent
    loaded = peltbench.load_run(run_dir)
    scores, _ = loaded.predict()
    assert scores == pytest.approx(alone.record["test"], abs=1e-9)
    trained = [p for n, p in loaded.model.named_parameters() if n.endswith("boft_R.scale")]
    assert trained and all((p - 1).abs().max() > 0 for p in trained)
    base = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    peft_model = PeftModel.from_pretrained(base, run_dir / "peft").eval()
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        torch.testing.assert_close(peft_model(**model_inputs(model_type, ids, mask, types)).logits,
                                   loaded.model(ids, mask, types), rtol=1e-5, atol=1e-6)
