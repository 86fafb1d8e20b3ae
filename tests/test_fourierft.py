"""FourierFT (methods/fourierft.py): drawn as PEFT 0.21 draws it, against its formula on ModernBERT, in fused groups,
under bf16 autocast, through peltbench (alone = fused, successive halving), saved, reloaded and exported. Its logits,
gradients, counts and export against PEFT's on every encoder are a row of tests/test_peft_matrix.py.

Tiny random encoders with O(1) weights (initializer_range 0.2). Tolerances as tests/test_encoders.py: 1e-5 relative /
1e-6 absolute.
"""

from __future__ import annotations

from types import MethodType

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close_to_scale, tiny_encoder
from peltbench.methods import count_method, member_state, parameter_counts
from peltbench.methods.fourierft import FourierFTLinear
from test_encoders import (assert_fused_as_alone, assert_members_equal_their_own_models,
                           assert_peft_copy_computes_alike, batch, build, method, mixed_group, model_inputs, reloaded)

O1 = {"initializer_range": 0.2}
SEED = 42  # test_encoders.build's model seed
N = 100    # coefficients per projection on the tiny models (of 32 · 32 entries)
# α on the tiny models: IDFT2 divides by out · in, so the paper's 140 on a 32 × 32 spectrum makes ΔW's entries ~1,
# five times W's, and the logits a function of rounding; at 20 they are ~0.14 and still move the logits by 0.3-0.5.
ALPHA = 20.0


def tiny_fourierft(**changes):
    return method("fourierft", **{"fourierft_n_frequency": N, "fourierft_scaling": ALPHA, **changes})
PEFT_TARGETS = {"bert": ["query", "value"], "roberta": ["query", "value"], "electra": ["query", "value"],
                "deberta-v2": ["query_proj", "value_proj"]}  # ModernBERT: see the formula test


def peft_fourierft(model_type: str, config):
    """PEFT's FourierFT with our n, α and entry seed, built after the global generator is seeded with our model seed:
    PEFT then draws each spectrum (torch.randn) where we draw ours."""
    from peft import FourierFTConfig, get_peft_model

    plain = tiny_encoder(model_type, dropout=0.0, **O1)
    torch.manual_seed(SEED)
    return get_peft_model(plain, FourierFTConfig(
        n_frequency=config.fourierft_n_frequency, scaling=config.fourierft_scaling,
        random_loc_seed=config.fourierft_entry_seed, target_modules=PEFT_TARGETS[model_type], task_type="SEQ_CLS"))


def peft_layers(peft) -> dict[str, object]:
    """PEFT's FourierFT layers by our stored module name."""
    return {name.removeprefix("base_model.model."): module for name, module in peft.named_modules()
            if hasattr(module, "fourierft_spectrum") and "default" in module.fourierft_spectrum}


@pytest.mark.parametrize("model_type", sorted(PEFT_TARGETS))
def test_fourierft_draws_its_entries_and_coefficients_as_peft(model_type):
    """From the same seeds (the entry seed; the model seed for c) our entries and coefficients are PEFT's, layer by
    layer, and so are the logits without anything copied across."""
    pytest.importorskip("peft")
    config = tiny_fourierft()
    ours = build(model_type, config, **O1)
    peft = peft_fourierft(model_type, config)
    state = member_state(ours, 0)
    layers = peft_layers(peft)
    assert len(layers) == 4
    for name, layer in layers.items():
        ours_layer = next(m for n, m in ours.named_modules() if ours.stored_name(n) == name)
        assert torch.equal(state[f"{name}.fourierft_spectrum"], layer.fourierft_spectrum["default"].detach())
        rows, columns = layer.indices["default"]
        assert torch.equal(ours_layer.entries[0], rows * layer.in_features + columns)
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, types), peft(**model_inputs(model_type, ids, mask, types)).logits,
                                   rtol=1e-5, atol=1e-6)


def test_fourierft_on_modernbert_is_the_formula_block_by_block():
    """PEFT can adapt only the whole Wqkv (one 3H × H spectrum): not ours. Against the formula instead, on the plain
    model: y = Wqkv x plus α Re(IDFT2(F_q)) x in the q rows and α Re(IDFT2(F_v)) x in the v rows, F_t zero but at the
    n entries PEFT's generator picks (seed 777), where it holds the member's c_t; logits and c's gradients."""
    config = tiny_fourierft()
    ours = build("modernbert", config, **O1).train()
    reference = tiny_encoder("modernbert", dropout=0.0, **O1).train()
    entries = torch.randperm(32 * 32, generator=torch.Generator().manual_seed(777))[:N]
    leaves = {}
    for index, (ours_layer, layer) in enumerate(zip(ours.layers, reference.model.layers)):
        fused = ours_layer.attn.Wqkv
        c = {t: getattr(fused, t).fourierft_spectrum[0].detach().clone().requires_grad_() for t in ("query", "value")}
        leaves[index] = c

        def forward(self, x, c=c, linear=layer.attn.Wqkv):
            def change(coefficients):
                spectrum = torch.zeros(32 * 32).index_put((entries,), coefficients).view(32, 32)
                return ALPHA * torch.fft.ifft2(spectrum).real

            out = F.linear(x, linear.weight, linear.bias)
            q, v = x @ change(c["query"]).T, x @ change(c["value"]).T
            return out + torch.cat([q, torch.zeros_like(q), v], dim=-1)

        layer.attn.Wqkv.forward = MethodType(forward, layer.attn.Wqkv)
    ids, mask, types = batch("modernbert")
    inputs = model_inputs("modernbert", ids, mask, types)
    logits, expected = ours(ids, mask, types), reference(**inputs).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
    plain = tiny_encoder("modernbert", dropout=0.0, **O1)(**inputs).logits
    assert (logits - plain).abs().max() > 1e-2
    labels = torch.tensor([0, 1, 1])
    F.cross_entropy(logits, labels).backward()
    F.cross_entropy(expected, labels).backward()
    for index, ours_layer in enumerate(ours.layers):
        for target in ("query", "value"):
            assert_close_to_scale(getattr(ours_layer.attn.Wqkv, target).fourierft_spectrum.grad[0],
                                  leaves[index][target].grad)
    assert parameter_counts(ours)["trainable_params"] == 2 * 2 * N


MIXED = [("fourierft", {"fourierft_n_frequency": N, "fourierft_scaling": ALPHA}),
         ("fourierft", {"fourierft_n_frequency": 40, "fourierft_scaling": 30.0, "fourierft_targets": ["key"]}),
         ("lora", {}),
         ("fourierft", {"fourierft_n_frequency": N, "fourierft_scaling": ALPHA, "fourierft_entry_seed": 5,
                        "fourierft_targets": ["query", "key", "value"]}),
         ("vera", {"vera_rank": 16}), ("c3a", {"c3a_block_size": 16})]


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_with_fourierft_and_other_methods_computes_each_members_logits_and_gradients(model_type):
    """FourierFT members of several n, scalings, entry seeds and targets beside LoRA, VeRA and C3A on one backbone:
    each member starts as its separate run draws it, and its logits and gradients equal its own model's."""
    group, methods, seeds = mixed_group(model_type, MIXED, **O1)
    for slot, (config, seed) in enumerate(zip(methods, seeds)):
        alone = build(model_type, config, seed, **O1)
        initial = member_state(group, slot)
        for name, tensor in member_state(alone, 0).items():
            assert torch.equal(initial[name][tuple(slice(0, s) for s in tensor.shape)], tensor), (slot, name)
        for name, module in alone.named_modules():  # the same spectral entries (a buffer, not saved)
            if isinstance(module, FourierFTLinear):
                grouped = next(m for n, m in group.named_modules() if group.stored_name(n) == alone.stored_name(name)
                               and isinstance(m, FourierFTLinear) and slot in m.users)
                n = int(config.fourierft_n_frequency)
                assert torch.equal(grouped.entries[slot, :n], module.entries[0])
    assert_members_equal_their_own_models(model_type, group, methods, seeds, **O1)


def test_bf16_autocast_on_a_cpu_builds_the_weight_change_in_fp32():
    """Under torch.autocast("cpu", bfloat16) the spectrum is transformed in fp32 (torch.fft has no bf16 on a CPU for
    every size) and the delta enters the projection as autocast's bf16: the logits are the fp32 model's to bf16
    rounding, and every coefficient gets a finite gradient."""
    model = build("roberta", tiny_fourierft(), **O1).train()
    ids, mask, types = batch("roberta")
    with torch.no_grad():
        exact = model(ids, mask, types)
    delta = next(m for m in model.modules() if isinstance(m, FourierFTLinear))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert delta.weight_change(model.members.select(delta.users, ids.device)).dtype == torch.float32
        logits = model(ids, mask, types)
    torch.testing.assert_close(logits, exact, rtol=0.1, atol=0.1)
    F.cross_entropy(logits, torch.tensor([0, 1, 1])).backward()
    grads = [m.fourierft_spectrum.grad for m in model.modules() if isinstance(m, FourierFTLinear)]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_a_count_on_the_meta_device_leaves_the_entries_of_later_models_real():
    """count_method builds on the meta device; the entries it draws for a shape must not be what a real model of that
    shape later gets (the permutation is cached per shape)."""
    from conftest import tiny_encoder_config

    config = tiny_fourierft()
    assert count_method(config, tiny_encoder_config("bert"))["trainable_params"] == 2 * 2 * N
    model = build("bert", config, **O1)
    entries = next(m for m in model.modules() if isinstance(m, FourierFTLinear)).entries
    assert entries.device.type == "cpu" and entries[0].unique().numel() == N
    with torch.no_grad():
        assert torch.isfinite(model(*batch("bert"))).all()


def test_a_bad_n_or_gate_is_one_line():
    """n beyond the projection's out · in entries is refused before torch for a local checkpoint (config.json), and
    when the model is built; FourierFT has no gate."""
    from omegaconf import OmegaConf

    from peltbench import UserError
    from peltbench.config import check_model_fit
    from peltbench.methods import check_method

    cfg = OmegaConf.create({"method": method("fourierft", fourierft_n_frequency=2000), "task": {"name": "rte"}})
    with pytest.raises(UserError, match=r"fourierft_n_frequency=2000 exceeds the 32 × 32 entries .*hidden_size 32"):
        check_model_fit(cfg, {"model_type": "bert", "hidden_size": 32})
    with pytest.raises(ValueError, match="fourierft_n_frequency=2000 exceeds"):
        build("bert", method("fourierft", fourierft_n_frequency=2000))
    with pytest.raises(ValueError, match="fourierft has no gate"):
        check_method(method("fourierft", gated=True))


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_fourierft_alone_and_fused_saves_reloads_and_loads_in_peft(model_type, tmp_path, glue_dir, caplog):
    """Through peltbench: FourierFT fused with LoRA writes its separate run's record; save.weights=true keeps the
    coefficients, load_run predicts what the run scored, and peft/ loads in PEFT with the same logits (RoBERTa); on
    ModernBERT no peft/ is written and the log says why."""
    pytest.importorskip("peft")
    import logging

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    extra = ("method.lr=5e-2", "save.weights=true", f"method.fourierft_n_frequency={N}",
             f"method.fourierft_scaling={ALPHA}", "method.head=train")
    with caplog.at_level(logging.INFO, logger="peltbench"):
        [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["fourierft"], False, *extra))
    fused = run_group([*sweep(checkpoint, glue_dir, tmp_path / "fused", ["lora"], True),
                       *sweep(checkpoint, glue_dir, tmp_path / "fused", ["fourierft"], True, *extra)])
    assert_fused_as_alone(alone, fused, 2)
    assert alone.record["trainable_params"] == 2 * 2 * N
    run_dir, loaded = reloaded(tmp_path / "alone", alone)
    if model_type == "modernbert":
        assert not (run_dir / "peft").exists()
        assert "PEFT's FourierFT adapts ModernBERT's whole fused Wqkv" in caplog.text
        return
    assert_peft_copy_computes_alike(model_type, checkpoint, run_dir, loaded)
    trained = loaded.model.layers[0].attention.self.query.fourierft_spectrum[0]
    initial = build(model_type, tiny_fourierft(), **O1).layers[0].attention.self.query
    assert (trained - initial.fourierft_spectrum[0]).abs().max() > 1e-3  # the coefficients trained
