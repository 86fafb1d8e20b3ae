"""HRA (methods/hra.py, on methods/rotation.py): its init, in groups, through peltbench, saved. Against PEFT 0.21's
HRA (logits, gradients, counts, the PEFT copy): tests/test_peft_matrix.py.

Tiny random encoders with O(1) weights (initializer_range 0.2). Tolerances as tests/test_encoders.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_trained_alike, tiny_encoder
from peltbench.methods import member_state
from peltbench.methods.hra import reflections
from test_encoders import assert_members_equal_their_own_models, batch, build, method, model_inputs
from test_oft import O1


def unpaired(model) -> None:
    """Non-identity products: the paired columns of PEFT's init (H_i H_i = I) replaced by independent ones."""
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("hra_u.weight"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))


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

    methods = [method(name, **changes) for name, changes in MIXED]
    seeds = [42 + i for i in range(len(methods))]
    group = build(model_type, methods, seeds, **O1)
    initial = [member_state(group, slot) for slot in range(len(methods))]
    unpaired(group)
    skewed(group)
    for slot, (config, seed) in enumerate(zip(methods, seeds)):  # drawn as a separate run draws them
        for name, tensor in member_state(build(model_type, config, seed, **O1), 0).items():
            assert torch.equal(initial[slot][name][tuple(slice(0, s) for s in tensor.shape)], tensor), (slot, name)
    assert_members_equal_their_own_models(model_type, group, methods, seeds, **O1)


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_hra_runs_alone_and_fused_saves_and_reloads(model_type, tmp_path, glue_dir):
    """Through peltbench: HRA fused with OFT gives its separate run's record; save.weights=true keeps the reflection
    vectors, load_run predicts what the run scored, and the reflections trained."""
    import peltbench

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import reference_head, sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    extra = ("method.lr=5e-2", "save.weights=true")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["hra"], False, *extra))
    fused = run_group(sweep(checkpoint, glue_dir, tmp_path / "fused", ["oft", "hra"], True, *extra))
    assert [o.status for o in [alone, *fused]] == ["ok"] * 3 and fused[1].record["fused"]["size"] == 2
    assert_trained_alike(alone.record, fused[1].record)
    assert alone.record["trainable_params"] == 2 * 32 * 8 * (1 if model_type == "modernbert" else 2)
    run_dir = next((tmp_path / "alone").rglob("result.json")).parent
    loaded = peltbench.load_run(run_dir)
    scores, _ = loaded.predict()
    assert scores == pytest.approx(alone.record["test"], abs=1e-9)
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        logits = loaded.model(ids, mask, types)
        plain = tiny_encoder(model_type, dropout=0.0, **O1)
        reference_head(plain, loaded.model)  # the trained head, so only the reflections can differ from here
        assert (plain(**model_inputs(model_type, ids, mask, types)).logits - logits).abs().max() > 1e-4  # trained
