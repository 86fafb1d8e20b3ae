"""DoRA against PEFT 0.21 (`LoraConfig(use_dora=True)`) on every encoder, and its norm against the plain formula.

Tiny random models with O(1) weights (initializer_range=0.2), dropout off; B and the magnitude are moved off their
initial values so that every term of W' = m · (W + s·BA) / ‖W + s·BA‖ matters. Tolerances as tests/test_encoders.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from peltbench.methods import count_method, member_state, parameter_counts
from peltbench.methods.dora import DoRALinear, row_norms
from test_encoders import ARCHITECTURES, batch, build, method, model_inputs, randomise, same_logits_then_backward
from conftest import tiny_encoder

O1 = {"initializer_range": 0.2}


def moved(model) -> None:
    """B non-zero (randomise) and m away from ‖W + s·BA‖, so that neither the delta nor the rescaling is 1."""
    randomise(model)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, DoRALinear):
                module.magnitude.mul_(1 + 0.3 * torch.randn(module.magnitude.shape, generator=generator))


def peft_dora(model_type: str, ours):
    """PEFT's DoRA on the same model and targets with our A, B and m copied in. On ModernBERT's fused Wqkv PEFT adapts
    the whole Linear: rank 2r, B zero outside the q and v blocks, and the k rows keep m = ‖W_k‖ (their scale is 1)."""
    from peft import LoraConfig, get_peft_model
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    fused = model_type == "modernbert"
    rank = 16 if fused else 8
    config = LoraConfig(r=rank, lora_alpha=2.0 * rank, target_modules=["Wqkv"] if fused else DEFAULTS[model_type],
                        lora_dropout=0.0, use_dora=True)
    peft = get_peft_model(tiny_encoder(model_type, dropout=0.0, **O1), config)
    state = member_state(ours, 0)
    with torch.no_grad():
        for name, module in peft.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            plain = name.removeprefix("base_model.model.")
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            m = module.lora_magnitude_vector["default"].weight
            if fused:
                a.copy_(torch.cat([state[f"{plain}.query.lora_a.weight"], state[f"{plain}.value.lora_a.weight"]]))
                b.zero_()
                b[:32, :8], b[64:, 8:] = state[f"{plain}.query.lora_b.weight"], state[f"{plain}.value.lora_b.weight"]
                m[:32], m[64:] = state[f"{plain}.query.magnitude"], state[f"{plain}.value.magnitude"]
            else:
                a.copy_(state[f"{plain}.lora_a.weight"])
                b.copy_(state[f"{plain}.lora_b.weight"])
                m.copy_(state[f"{plain}.magnitude"])
    return peft


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_dora_equals_peft(model_type):
    """Logits, the gradients of A, B and m, and the count equal PEFT's DoRA on the same model and targets."""
    pytest.importorskip("peft")
    ours = build(model_type, method("dora"), **O1)
    moved(ours)
    peft = peft_dora(model_type, ours).train()
    ours.train()
    grads = same_logits_then_backward(model_type, ours, peft, tiny_encoder(model_type, dropout=0.0, **O1))
    counted = 0
    for name, module in peft.named_modules():
        if not hasattr(module, "lora_A") or "default" not in module.lora_A:
            continue
        plain = name.removeprefix("base_model.model.")
        a, b = module.lora_A["default"].weight.grad, module.lora_B["default"].weight.grad
        m = module.lora_magnitude_vector["default"].weight.grad
        close = dict(rtol=1e-5, atol=1e-6)
        if model_type == "modernbert":  # our q and v blocks; PEFT's k rows are not DoRA of ours
            q, v = f"{plain}.query", f"{plain}.value"
            torch.testing.assert_close(torch.cat([grads[f"{q}.lora_a.weight"], grads[f"{v}.lora_a.weight"]]), a, **close)
            torch.testing.assert_close(grads[f"{q}.lora_b.weight"], b[:32, :8], **close)
            torch.testing.assert_close(grads[f"{v}.lora_b.weight"], b[64:, 8:], **close)
            torch.testing.assert_close(torch.cat([grads[f"{q}.magnitude"], grads[f"{v}.magnitude"]]),
                                       torch.cat([m[:32], m[64:]]), **close)
            counted += a.numel() + 2 * (32 * 8 + 32)
        else:
            torch.testing.assert_close(grads[f"{plain}.lora_a.weight"], a, **close)
            torch.testing.assert_close(grads[f"{plain}.lora_b.weight"], b, **close)
            torch.testing.assert_close(grads[f"{plain}.magnitude"], m, **close)
            counted += a.numel() + b.numel() + m.numel()
    assert parameter_counts(ours)["trainable_params"] == counted == 2 * 2 * (32 * 8 + 8 * 32 + 32)


def test_row_norms_equal_the_norm_of_the_full_matrix():
    """The expanded norm (no out × in matrix per member) equals ‖W + s·B_m A_m‖ per row, for members of two ranks."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=generator)
    a, b = torch.randn(3, 8, 32, generator=generator), torch.randn(3, 48, 8, generator=generator)
    a[2, 4:], b[2, :, 4:] = 0, 0  # a member of rank 4 padded to the group's 8
    s = torch.tensor([2.0, 0.5, 4.0])
    expected = torch.linalg.norm(weight + s[:, None, None] * b @ a, dim=-1)
    torch.testing.assert_close(row_norms(weight, a, b, s), expected, rtol=1e-5, atol=1e-5)


def test_the_norm_is_a_constant_in_backward():
    """PEFT and DoRA §4.3: ‖W + s·BA‖ is a constant in backward. Against the formula on the full matrix, with the norm
    detached; kept in the graph, it would change A's and B's gradients (checked to differ, so this can fail)."""
    ours = build("bert", method("dora"), **O1)
    dora = ours.layers[0].attention.self.query
    with torch.no_grad():
        dora.lora_b.weight[0] = 0.3 * torch.randn_like(dora.lora_b.weight[0])
    x = torch.randn(2, 5, 32)
    weight, bias = dora.frozen()

    def formula(detach: bool):
        a, b, m = (p.detach().clone().requires_grad_() for p in (dora.lora_a.weight[0], dora.lora_b.weight[0],
                                                                dora.magnitude[0]))
        full = weight + 2.0 * b @ a
        norm = torch.linalg.norm(full, dim=1)
        out = (m / (norm.detach() if detach else norm)) * (x @ full.T) + bias
        out.square().sum().backward()
        return out, [p.grad for p in (a, b, m)]

    out = dora(x)
    out.square().sum().backward()
    grads = [dora.lora_a.weight.grad[0], dora.lora_b.weight.grad[0], dora.magnitude.grad[0]]
    expected, expected_grads = formula(detach=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for grad, reference in zip(grads, expected_grads):
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-4)
    _, attached = formula(detach=False)
    assert not torch.allclose(grads[0], attached[0], rtol=1e-3, atol=1e-3)


def test_dora_refuses_a_gate_and_a_second_delta_on_its_projections():
    from peltbench.methods import check_method

    with pytest.raises(ValueError, match="component dora has no gate"):
        check_method(method("dora", gated=True, components=["dora", "adapter"], bottleneck=8))
    with pytest.raises(ValueError, match="dora rescales the whole projection W, so it cannot be combined with lora"):
        check_method(method("dora", components=["dora", "lora"]))


def test_counts_on_roberta_base_and_deberta_v3_base_shapes():
    """ECOSYSTEM.md (PEFT on roberta-base): 313,344; DeBERTa-v3-base has the same q, v shapes (768 × 768, 12 layers)."""
    roberta = AutoConfig.for_model("roberta")
    assert count_method(method("dora"), roberta)["trainable_params"] == 313_344
    deberta = AutoConfig.for_model("deberta-v2", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                   intermediate_size=3072, relative_attention=True, share_att_key=True,
                                   pos_att_type=["p2c", "c2p"], position_buckets=256, vocab_size=128100)
    assert count_method(method("dora"), deberta)["trainable_params"] == 313_344


@pytest.mark.parametrize("model_type", ["deberta-v2", "modernbert"])
def test_a_saved_dora_run_reloads_and_loads_in_peft(model_type, tmp_path, glue_dir):
    """load_run rescores it; peft/ loads in PEFT with the same logits (ModernBERT: one DoRA of rank 2r on Wqkv whose
    k rows keep m = ‖W_k‖)."""
    pytest.importorskip("peft")
    import peltbench
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    [outcome] = run_group(sweep(checkpoint, glue_dir, tmp_path / "runs", ["dora"], False, "save.weights=true",
                                "method.lr=0.01"))
    run_dir = next((tmp_path / "runs").rglob("result.json")).parent
    loaded = peltbench.load_run(run_dir)
    assert loaded.predict()[0] == pytest.approx(outcome.record["test"], abs=1e-9)
    base = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    peft_model = PeftModel.from_pretrained(base, run_dir / "peft").eval()
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        torch.testing.assert_close(peft_model(**model_inputs(model_type, ids, mask, types)).logits,
                                   loaded.model(ids, mask, types), rtol=1e-5, atol=1e-6)
