"""C3A (methods/c3a.py): drawn as PEFT 0.21 draws it, its member-batched convolution PEFT's, in fused groups (members
of several block sizes), under bf16 autocast, through peltbench (alone = fused, successive halving), saved, reloaded and
exported. Its logits, gradients, counts and export against PEFT's on every encoder (ModernBERT: PEFT's C3A on the whole
Wqkv) are a row of tests/test_peft_matrix.py.

Tiny random encoders with O(1) weights (initializer_range 0.2), block size 8 (the paper's 128 cannot tile hidden 32).
Tolerances as tests/test_encoders.py: 1e-5 relative / 1e-6 absolute.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import ENCODERS, assert_close_to_scale, tiny_encoder
from peltbench.methods import member_state
from peltbench.methods.c3a import C3ALinear, MemberCircularConvolution
from test_encoders import (assert_fused_as_alone, assert_members_equal_their_own_models,
                           assert_peft_copy_computes_alike, batch, build, method, mixed_group, model_inputs, reloaded)

O1 = {"initializer_range": 0.2}
SEED = 42  # test_encoders.build's model seed
B = 8      # block size on the tiny models (hidden 32)
PEFT_TARGETS = {"bert": ["query", "value"], "roberta": ["query", "value"], "electra": ["query", "value"],
                "deberta-v2": ["query_proj", "value_proj"], "modernbert": ["Wqkv"]}


def scaled(model, scale: float = 2.0) -> None:
    """Kernels of N(0, scale²): the xavier init's ΔW (entries ~0.006 at hidden 32, after PEFT's 1/in) would barely
    move the logits; these make it ~0.06, a third of W's."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, C3ALinear):
                module.c3a_kernel.copy_(scale * torch.randn(module.c3a_kernel.shape, generator=generator))


@pytest.mark.parametrize("model_type", [t for t in sorted(ENCODERS) if t != "modernbert"])
def test_c3a_draws_its_kernels_as_peft(model_type):
    """From the same model seed our kernels are PEFT's xavier-uniform draws, layer by layer, and so are the logits
    without anything copied across (ModernBERT: PEFT draws one Wqkv kernel, over other bounds)."""
    pytest.importorskip("peft")
    from peft import C3AConfig, get_peft_model

    ours = build(model_type, method("c3a", c3a_block_size=B), **O1)
    plain = tiny_encoder(model_type, dropout=0.0, **O1)
    torch.manual_seed(SEED)
    peft = get_peft_model(plain, C3AConfig(block_size=B, target_modules=PEFT_TARGETS[model_type], task_type="SEQ_CLS"))
    state = member_state(ours, 0)
    drawn = {name.removeprefix("base_model.model.").replace(".default", ""): parameter.detach()
             for name, parameter in peft.named_parameters() if ".c3a_kernel." in name}
    assert sorted(drawn) == sorted(name for name in state if name.endswith(".c3a_kernel")) and len(drawn) == 4
    for name, kernel in drawn.items():
        assert torch.equal(state[name], kernel), name
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, types), peft(**model_inputs(model_type, ids, mask, types)).logits,
                                   rtol=1e-5, atol=1e-6)


def test_the_member_convolution_is_pefts_and_the_circulant_product():
    """Per member, forward and gradients equal PEFT's BlockCircularConvolution and the block-circulant matrix PEFT's
    get_circulant_fast builds (the merged weight change)."""
    pytest.importorskip("peft")
    from peft.tuners.c3a.utils import BlockCircularConvolution, get_circulant_fast

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, 8, generator=generator, requires_grad=True)  # members, rows, in/b, b
    w = torch.randn(3, 2, 4, 8, generator=generator, requires_grad=True)  # members, out/b, in/b, b
    out = MemberCircularConvolution.apply(x, w)
    grad = torch.randn(out.shape, generator=generator)
    out.backward(grad)
    for m in range(3):
        xm, wm = x[m].detach().clone().requires_grad_(), w[m].detach().clone().requires_grad_()
        theirs = BlockCircularConvolution.apply(xm.reshape(5, 32), wm)
        torch.testing.assert_close(out[m].reshape(5, 16), theirs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(theirs, xm.reshape(5, 32) @ get_circulant_fast(wm).T, rtol=1e-5, atol=1e-5)
        theirs.backward(grad[m].reshape(5, 16))
        assert_close_to_scale(x.grad[m], xm.grad)
        assert_close_to_scale(w.grad[m], wm.grad)


MIXED = [("c3a", {"c3a_block_size": B}), ("lora", {}), ("c3a", {"c3a_block_size": 16, "c3a_targets": ["key"]}),
         ("fourierft", {"fourierft_n_frequency": 60, "fourierft_scaling": 20.0}),
         ("c3a", {"c3a_block_size": 4, "c3a_targets": ["query", "key", "value"]}), ("c3a", {"c3a_block_size": B}),
         ("ia3", {})]


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_with_c3a_of_several_block_sizes_computes_each_members_logits_and_gradients(model_type):
    """C3A members of block sizes 4, 8 and 16 (one delta per size on a projection) and other targets beside LoRA,
    FourierFT and (IA)³ on one backbone: each member starts as its separate run draws it, and its logits and gradients
    equal its own model's."""
    group, methods, seeds = mixed_group(model_type, MIXED, **O1)
    for slot, (config, seed) in enumerate(zip(methods, seeds)):
        for name, tensor in member_state(build(model_type, config, seed, **O1), 0).items():
            assert torch.equal(member_state(group, slot)[name], tensor), (slot, name)
    scaled(group)
    deltas = [m for m in group.modules() if isinstance(m, C3ALinear)]
    assert sorted({m.block_size for m in deltas}) == [4, 8, 16]
    assert_members_equal_their_own_models(model_type, group, methods, seeds, **O1)


def test_bf16_autocast_on_a_cpu_convolves_in_fp32():
    """Under torch.autocast("cpu", bfloat16) the FFTs run in fp32 (torch.fft has no bf16 on a CPU for every size) and
    the delta joins the projection's bf16 output: the logits are the fp32 model's to bf16 rounding, and every kernel
    gets a finite gradient."""
    model = build("roberta", method("c3a", c3a_block_size=B), **O1).train()
    scaled(model)
    ids, mask, types = batch("roberta")
    with torch.no_grad():
        exact = model(ids, mask, types)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids, mask, types)
    torch.testing.assert_close(logits, exact, rtol=0.1, atol=0.1)
    F.cross_entropy(logits, torch.tensor([0, 1, 1])).backward()
    grads = [m.c3a_kernel.grad for m in model.modules() if isinstance(m, C3ALinear)]
    assert len(grads) == 4 and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_a_block_size_that_does_not_tile_or_a_gate_is_one_line():
    """b = 128 on hidden 32 is refused before torch for a local checkpoint (config.json) and when the model is built;
    C3A has no gate."""
    from omegaconf import OmegaConf

    from peltbench import UserError
    from peltbench.config import check_model_fit
    from peltbench.methods import check_method

    cfg = OmegaConf.create({"method": method("c3a", c3a_block_size=128), "task": {"name": "rte"}})
    with pytest.raises(UserError, match=r"c3a_block_size=128 must divide .*\(bert hidden_size 32\)"):
        check_model_fit(cfg, {"model_type": "bert", "hidden_size": 32})
    with pytest.raises(ValueError, match=r"c3a_block_size=128 must divide the adapted projections' input and output"):
        build("bert", method("c3a", c3a_block_size=128))
    with pytest.raises(ValueError, match="c3a has no gate"):
        check_method(method("c3a", gated=True))


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_c3a_alone_and_fused_saves_reloads_and_loads_in_peft(model_type, tmp_path, glue_dir):
    """Through peltbench: C3A fused with LoRA and a C3A of another block size writes its separate run's record;
    save.weights=true keeps the kernels, load_run predicts what the run scored, and peft/ loads in PEFT with the same
    logits (ModernBERT: one C3A on Wqkv)."""
    pytest.importorskip("peft")
    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    extra = ("method.lr=2e-1", "save.weights=true", "method.head=train")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["c3a"], False, *extra))
    fused = run_group([*sweep(checkpoint, glue_dir, tmp_path / "fused", ["lora"], True),
                       *sweep(checkpoint, glue_dir, tmp_path / "fused", ["c3a"], True, *extra),
                       *sweep(checkpoint, glue_dir, tmp_path / "fused", ["c3a"], True, "method.c3a_block_size=16")])
    assert_fused_as_alone(alone, fused, 3)
    assert alone.record["trainable_params"] == 2 * 2 * 32 * 32 // B
    run_dir, loaded = reloaded(tmp_path / "alone", alone)
    assert_peft_copy_computes_alike(model_type, checkpoint, run_dir, loaded)
    start = build(model_type, method("c3a", c3a_block_size=B), **O1)
    moved = [(a - b).abs().max() for (name, a), b in zip(member_state(loaded.model, 0).items(),
                                                         member_state(start, 0).values()) if "c3a_kernel" in name]
    assert moved and max(moved) > 1e-3  # the kernels trained
