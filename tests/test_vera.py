"""VeRA on ModernBERT's fused Wqkv against its formula, its shared matrices in groups, a gated mixture. Against PEFT
0.21 (`VeraConfig`: the same A and B from the model seed, logits, λ gradients, counts, the PEFT copy) on every encoder
PEFT can adapt alike: tests/test_peft_matrix.py.

Tiny random models with O(1) weights (initializer_range=0.2), dropout off; λ_b and λ_d are moved off their initial
values (λ_b = 0 would hide the delta). Tolerances as tests/test_encoders.py.
"""

from __future__ import annotations

from types import MethodType

import torch

from conftest import tiny_encoder
from peltbench.methods.vera import VeRALinear
from test_encoders import batch, build, method, model_inputs

O1 = {"initializer_range": 0.2}
CLOSE = dict(rtol=1e-5, atol=1e-6)


def moved(model) -> None:
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, VeRALinear):
                module.vera_lambda_b.copy_(0.5 * torch.randn(module.vera_lambda_b.shape, generator=generator))
                module.vera_lambda_d.mul_(1 + torch.randn(module.vera_lambda_d.shape, generator=generator))


def test_vera_on_modernbert_fused_wqkv_is_the_formula_block_by_block():
    """PEFT can adapt only the whole Wqkv (one λ_d for q, k and v, B sized 3H): not ours. Against the formula instead:
    y = Wqkv x, plus λ_b ⊙ B[:H](λ_d ⊙ A x) in the q rows and in the v rows, each with its own λ, A and B shared."""
    ours = build("modernbert", method("vera", vera_rank=16), **O1)
    moved(ours)
    reference = tiny_encoder("modernbert", dropout=0.0, **O1)
    for ours_layer, layer in zip(ours.layers, reference.model.layers):
        fused = ours_layer.attn.Wqkv
        a, b = fused.query.shared.a[0], fused.query.shared.b[0]

        def forward(self, x, q=fused.query, v=fused.value, a=a, b=b, linear=layer.attn.Wqkv):
            out = torch.nn.functional.linear(x, linear.weight, linear.bias)
            q_delta = q.vera_lambda_b[0] * ((q.vera_lambda_d[0] * (x @ a.T)) @ b.T)
            v_delta = v.vera_lambda_b[0] * ((v.vera_lambda_d[0] * (x @ a.T)) @ b.T)
            return out + torch.cat([q_delta, torch.zeros_like(q_delta), v_delta], dim=-1)

        layer.attn.Wqkv.forward = MethodType(forward, layer.attn.Wqkv)
    ours.head.out.weight.data.copy_(reference.classifier.weight.data[None])
    ours.head.out.bias.data.copy_(reference.classifier.bias.data[None])
    ids, mask, types = batch("modernbert")
    with torch.no_grad():
        logits = ours(ids, mask, types)
        torch.testing.assert_close(logits, reference(**model_inputs("modernbert", ids, mask, types)).logits, **CLOSE)
        assert (logits - tiny_encoder("modernbert", dropout=0.0, **O1)(
            **model_inputs("modernbert", ids, mask, types)).logits).abs().max() > 1e-2


def test_members_with_other_seeds_have_other_shared_matrices_and_gates_draw_as_alone():
    one = build("bert", [method("vera", vera_rank=16), method("vera", vera_rank=8, gated=True)], seeds=[1, 2], **O1)
    shared = one.layers[0].attention.self.query.shared
    alone = build("bert", method("vera", vera_rank=8, gated=True), seeds=2, **O1)
    assert torch.equal(shared.a[1, :8], alone.layers[0].attention.self.query.shared.a[0])
    assert not torch.equal(shared.a[0, :8], shared.a[1, :8])
    assert not shared.a[1, 8:].any() and not shared.b[1, :, 8:].any()  # the rank-8 member's padding
    assert torch.equal(one.layers[1].attention.self.value.coefficient.gate.linear.weight[1],
                       alone.layers[1].attention.self.value.coefficient.gate.linear.weight[0])


def test_a_gated_vera_prefix_adapter_mixture_trains_and_records_its_gates(tiny_checkpoint, glue_dir, tmp_path):
    """A mixture beyond UniPELT (issue 19, item 5): every component gated, each gate in the record."""
    from conftest import compose_config, tiny_run_overrides
    from peltbench.runner import run_group

    from omegaconf import OmegaConf

    cfg = compose_config("method=unipelt_ap", "task=rte", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path))
    OmegaConf.set_struct(cfg, False)
    cfg.method.components = ["vera", "prefix", "adapter"]
    cfg.method.update(vera_rank=16, vera_targets=["query", "value"], vera_d_initial=0.1)
    [outcome] = run_group([cfg])
    assert outcome.status == "ok", outcome.error
    gates = outcome.record["gates"]
    assert set(gates) == {"adapter", "prefix", "vera_query", "vera_value"}
    assert all(len(values) == 2 and all(0 < v < 1 for v in values) for values in gates.values())
