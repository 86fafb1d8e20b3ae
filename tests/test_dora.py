"""DoRA: its norm against the plain formula, its refusals, a saved run. Against PEFT 0.21 (`LoraConfig(use_dora=True)`:
logits, the gradients of A, B and m, counts, the PEFT copy) on every encoder: tests/test_peft_matrix.py.

Tiny random models with O(1) weights (initializer_range=0.2), dropout off. Tolerances as tests/test_encoders.py.
"""

from __future__ import annotations

import pytest
import torch

from peltbench.methods import check_method
from peltbench.methods.dora import row_norms
from test_encoders import build, method

O1 = {"initializer_range": 0.2}


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
    with pytest.raises(ValueError, match="component dora has no gate"):
        check_method(method("dora", gated=True, components=["dora", "adapter"], bottleneck=8))
    with pytest.raises(ValueError, match="dora with lora: dora rescales the whole projection W, which lora changes too"):
        check_method(method("dora", components=["dora", "lora"]))


@pytest.mark.parametrize("model_type", ["deberta-v2", "modernbert"])
def test_a_saved_dora_run_reloads(model_type, tmp_path, glue_dir):
    """load_run rescores it (its peft/ copy: tests/test_peft_matrix.py)."""
    import peltbench

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    [outcome] = run_group(sweep(checkpoint, glue_dir, tmp_path / "runs", ["dora"], False, "save.weights=true",
                                "method.lr=0.01"))
    run_dir = next((tmp_path / "runs").rglob("result.json")).parent
    loaded = peltbench.load_run(run_dir)
    assert loaded.predict()[0] == pytest.approx(outcome.record["test"], abs=1e-9)
