"""Every method through the same checks: trainable set, parameter count, forward/backward, gates, equivalences."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from transformers import BertConfig, BertForSequenceClassification

from conftest import TINY_METHOD_SETTINGS, tiny_backbone
from peltbench.methods import build_pelt_model, parameter_counts
from peltbench.methods.base import Gate, PeltModel
from peltbench.methods.prefix import PrefixSelfAttention
from peltbench.packaged import options, packaged_config

METHODS = options("method")

# Stored parameters per task for the tiny config (H = 32, 2 layers, intermediate 64, vocab 64, 128 positions),
# METHODS.md's counting, worked out by hand:
#   adapter (48):  per layer Down 32·48+48 + Up 48·32+32 = 3,152            → 6,304
#   prefix (L):    L · 2 · layers · H = L · 128                              → 1,280 (L=10), 6,400 (L=50), 1,024 (L=8)
#   LoRA (r=8):    per projection 32·8 + 8·32 = 512, query+value, 2 layers    → 2,048
#   gate:          Linear(32 → 1) = 33, one per layer and submodule
#   BitFit:        embeddings LN 32 + per layer (96 QKV + 32 + 32 + 64 + 32 + 32) + pooler 32 = 32 + 2·288 + 32 → 640
#   LN-tuning:     (1 + 2 · layers) LayerNorms × 2 × 32                       → 320
#   MAM:           prefix L=8 1,024 + parallel adapter (8) 2·(32·8+8 + 8·32+32) = 1,104 → 2,128
#   (IA)³:         per layer l_k 32 + l_v 32 + l_ff 64                          → 256
#   fine-tuning:   embeddings 64·32 + 128·32 + 2·32 + 64 = 6,272; per layer 3·1,056 + 1,056 + 64 + 2,112 + 2,080 + 64
#                  = 8,544; pooler 1,056 → 6,272 + 2·8,544 + 1,056 = 24,416
TINY_STORED = {
    "ft": 24_416, "bitfit": 640, "adapter": 6_304, "prefix": 1_280, "prefix_l50": 6_400, "lora": 2_048,
    "unipelt_ap": 6_304 + 1_280 + 4 * 33, "unipelt_apl": 6_304 + 1_280 + 2_048 + 8 * 33,
    "unipelt_ap_nogate": 6_304 + 1_280, "unipelt_apl_nogate": 6_304 + 1_280 + 2_048,
    "ln": 320, "prefix_ln": 1_280 + 320, "mam": 2_128,
    "dora": 2_048 + 4 * 32,  # LoRA's A, B + a magnitude per output feature of each of the 4 adapted projections
    "lora_fa": 4 * 8 * 32,   # LoRA's B only (A frozen): 1,024
    "vera": 4 * (1024 + 32),  # λ_d (r = 1024) + λ_b (out = 32) per adapted projection: 4,224
    "mam_he": 30 * 128 + 2 * (32 * 512 + 512 + 512 * 32 + 32),  # prefix L=30 3,840 + parallel adapter (512) 66,624
    "adalora": 2 * 12 * (4 * (32 + 32 + 1) + 2 * (32 + 64 + 1)),  # r₀ 12 on q, k, v, attention out, FFN in, FFN out
    "oft": 2 * 2 * 32 * 31 // 2,  # q, v of 2 layers: one block of b = 32 (H = 32), 496 skew entries each
    "hra": 2 * 2 * 32 * 8,  # q, v of 2 layers: 8 reflection vectors of 32
    "boft": 2 * 2 * (2 * 4 * 8 * 8 + 32),  # q, v of 2 layers: m = 2 factors of 4 blocks 8 × 8, and s (32)
    "ia3": 2 * (32 + 32 + 64),
    "ptuning_v2": 20 * 128,  # P-tuning v2: its L = 20 prefix tensor itself
    "prompt": 20 * 32,       # prompt tuning: P = 20 embeddings of width 32
    "fourierft": 4 * 1000,   # n = 1000 coefficients (of the 32 · 32 = 1,024 entries) on q, v of 2 layers
    "c3a": 4 * 32 * 32 // 8,  # q, v of 2 layers: (32 / b)² kernels of b = 8 (TINY_METHOD_SETTINGS: 128 cannot tile 32)
    "road": 2 * (5 * 32 + 64),  # road_1 on the 6 Linears of 2 layers: one (θ, α) per output pair (out per Linear)
    "delora": 4 * (8 * 32 + 32 * 8 + 1),  # r = 8 A, B and one λ per adapted projection (q, v of 2 layers)
}
# METHODS.md's table for BERT-base (head excluded); MAM is ours: prefix L=8 147,456 + parallel adapter 156,768.
BERT_BASE_STORED = {
    "ft": 109_482_240, "bitfit": 102_912, "adapter": 894_528, "prefix": 184_320, "lora": 294_912,
    "unipelt_ap": 1_097_304, "unipelt_apl": 1_410_672, "ln": 38_400, "prefix_ln": 222_720, "mam": 304_224,
    "mam_he": 10_005_504,  # METHODS.md: He et al.'s MAM, prefix L=30 552,960 + parallel adapter (512) 9,452,544
    "dora": 313_344, "lora_fa": 147_456, "vera": 43_008,  # ECOSYSTEM.md, measured with PEFT on roberta-base shapes (the same as BERT's)
    "adalora": 1_991_520,  # the initial budget, as PEFT counts it (docs/protocol.md §4.13)
    "oft": 285_696, "hra": 147_456,  # ECOSYSTEM.md: PEFT's counts on roberta-base, whose q, v shapes BERT-base shares
    "boft": 313_344,  # 24 · (2 · 96 · 8 · 8 + 768): PEFT's count with m = 2 (its 165,888 is m = 1: test_boft.py)
    "ia3": 12 * (768 + 768 + 3_072),  # (IA)³ paper's three places: 55,296
    "ptuning_v2": 20 * 2 * 12 * 768,  # 368,640
    "prompt": 20 * 768,  # 15,360
    "fourierft": 24 * 1000,  # n = 1000 on q, v of 12 layers: 24,000 (the FourierFT paper's and PEFT's count)
    "c3a": 24 * 768 * 768 // 128,  # b = 128 on q, v of 12 layers: 110,592 (the C3A paper's 0.111M)
    "road": 12 * (5 * 768 + 3_072),  # road_1 on all 6 Linears of 12 layers: 82,944 (PEFT's, test_peft_matrix.py)
    "delora": 294_912 + 24,  # LoRA r = 8 on q, v + one λ per projection: 294,936 (PEFT's count)
}
HEAD = {"train": {"head.out.weight", "head.out.bias"}, "bias": {"head.out.bias"}, "frozen": set()}


def method_config(name: str, **changes):
    config = copy.deepcopy(packaged_config(f"method/{name}.yaml"))
    for key, value in changes.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def build(name: str, num_labels: int = 2, **changes) -> PeltModel:
    """Method `name` on the tiny BERT, fitted to it (conftest.TINY_METHOD_SETTINGS), with `changes`."""
    config = method_config(name, **{**TINY_METHOD_SETTINGS.get(name, {}), **changes})
    return build_pelt_model(tiny_backbone(num_labels), config, model_seed=42).eval()


def inputs(batch: int = 3, length: int = 9, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 64, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length - 3 :] = 0  # one padded row
    return input_ids, mask, torch.zeros_like(input_ids)


def test_menu_is_the_issue_list():
    assert set(METHODS) == set(TINY_STORED)


@pytest.mark.parametrize("name", METHODS)
def test_parameter_count_tiny(name):
    assert parameter_counts(build(name))["trainable_params"] == TINY_STORED[name]


@pytest.mark.parametrize("name", sorted(BERT_BASE_STORED))
def test_parameter_count_bert_base_matches_methods_table(name):
    with torch.device("meta"):
        model = build_pelt_model(BertForSequenceClassification(BertConfig()), method_config(name), 42)
    counts = parameter_counts(model)
    assert counts["trainable_params"] == BERT_BASE_STORED[name]
    assert counts["backbone_params"] == 109_482_240


def _trainable_names(model: PeltModel) -> set[str]:
    return {n.removeprefix("backbone.") for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", METHODS)
def test_trainable_set(name):
    """Each method trains exactly what METHODS.md says, and the head as its config says."""
    model = build(name)
    config = method_config(name)
    names = _trainable_names(model)
    assert {n for n in names if n.startswith("head.")} == HEAD[config.head]
    body = {n for n in names if not n.startswith("head.")}
    expected_fragment = {
        "full": None, "bitfit": "bias", "ln": "LayerNorm", "adapter": ".adapter.",
        "parallel_adapter": ".parallel_adapter.", "prefix": "prefix", "lora": "lora_b" if config.get("lora_freeze_a")
        else "lora_", "dora": ("lora_", ".magnitude"), "vera": "vera_lambda_", "adalora": ".lora_",
        "oft": ".oft_R.", "hra": ".hra_u.", "boft": ".boft_R.", "ia3": "ia3_l", "prompt": "prompt.",
        "fourierft": ".fourierft_spectrum", "c3a": ".c3a_kernel", "road": (".road_theta", ".road_alpha"),
        "delora": ".delora_",
    }
    allowed = [f for c in config.components for f in (expected_fragment[c] if isinstance(expected_fragment[c], tuple)
                                                      else [expected_fragment[c]])]
    if None in allowed:  # fine-tuning: everything
        assert body == {n.removeprefix("backbone.") for n, _ in model.named_parameters() if n.startswith("backbone.")}
        return
    gates = {n for n in body if ".gate." in n}
    assert all(any(fragment in n for fragment in allowed) for n in body - gates), sorted(body)
    assert bool(gates) == bool(config.get("gated", False))


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("num_labels", [2, 1])
def test_forward_backward_reaches_exactly_the_trainable(name, num_labels):
    model = build(name, num_labels=num_labels).train()
    logits = model(*inputs())
    assert logits.shape == (3, num_labels)
    logits.pow(2).mean().backward()
    for parameter_name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad is not None, parameter_name
        else:
            assert parameter.grad is None, parameter_name
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert any(g.abs().sum() > 0 for g in grads)


def test_bitfit_trains_every_bias_and_only_biases():
    names = _trainable_names(build("bitfit"))
    all_biases = {n for n, _ in tiny_backbone().bert.named_parameters() if n.endswith("bias")}
    assert names == {f"bert.{n}" for n in all_biases} | {"head.out.bias"}


def test_ln_trains_every_layernorm():
    names = _trainable_names(build("ln"))
    assert sorted(n for n in names if "LayerNorm" in n) == sorted(
        f"bert.{n}" for n, _ in tiny_backbone().bert.named_parameters() if "LayerNorm" in n
    )


@pytest.mark.parametrize("name", ["unipelt_ap", "unipelt_apl"])
def test_gate_shape_and_range(name):
    model = build(name)
    model.members.start_gate_recording()
    model(*inputs())
    [gates] = model.members.stop_gate_recording()
    expected = {"adapter", "prefix"} | ({"lora_query", "lora_value"} if name == "unipelt_apl" else set())
    assert set(gates) == expected
    for values in gates.values():
        assert len(values) == 2 and all(0 < v < 1 for v in values)
    gate = next(m for m in model.modules() if isinstance(m, Gate))
    model.members.token_mask = inputs()[1]
    value = gate(torch.randn(3, 9, 32))
    assert value.shape == (3,) and bool(((value > 0) & (value < 1)).all())


def test_gate_ignores_padding():
    """The masked mean: padding a sequence further leaves every gate and the output unchanged."""
    model = build("unipelt_apl")
    input_ids, mask, types = inputs(batch=2)
    padded = torch.cat([input_ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    model.members.start_gate_recording()
    short = model(input_ids, mask, types)
    [gates_short] = model.members.stop_gate_recording()
    model.members.start_gate_recording()
    long = model(padded, padded_mask, torch.zeros_like(padded))
    [gates_long] = model.members.stop_gate_recording()
    torch.testing.assert_close(short, long)
    for key in gates_short:
        assert gates_short[key] == pytest.approx(gates_long[key], abs=1e-6)


def _reference(model: PeltModel | None = None, num_labels: int = 2):
    """The plain backbone, with the head of `model`'s (only) member."""
    reference = tiny_backbone(num_labels)
    if model is not None:
        reference.classifier.weight.data.copy_(model.head.out.weight[0])
        reference.classifier.bias.data.copy_(model.head.out.bias[0])
    return reference


def test_ungated_adapter_with_zero_up_leaves_output_unchanged():
    model = build("adapter")
    for layer in model.layers:
        torch.nn.init.zeros_(layer.output.adapter.up.weight)
        torch.nn.init.zeros_(layer.output.adapter.up.bias)
    reference = _reference(model)
    torch.testing.assert_close(model(*inputs()), reference(*_as_kwargs(inputs())).logits)


def test_lora_with_zero_b_leaves_output_unchanged():
    model = build("lora")  # B starts at zero (METHODS.md), so the model starts as the pretrained one
    reference = _reference(model)
    torch.testing.assert_close(model(*inputs()), reference(*_as_kwargs(inputs())).logits)


def test_parallel_adapter_starts_as_the_pretrained_model():
    model = build("mam", components=["parallel_adapter"])
    reference = _reference(model)
    torch.testing.assert_close(model(*inputs()), reference(*_as_kwargs(inputs())).logits)


def test_closed_gates_switch_adapter_and_lora_off():
    """Gate = 0 on adapter and LoRA (bias → -inf) gives the model without them, even with B ≠ 0."""
    model = build("unipelt_apl", components=["adapter", "lora"])
    for module in model.modules():
        if isinstance(module, Gate):
            torch.nn.init.constant_(module.linear.bias, -1e4)
        if hasattr(module, "lora_b"):
            torch.nn.init.normal_(module.lora_b.weight)
    reference = _reference(model)
    torch.testing.assert_close(model(*inputs()), reference(*_as_kwargs(inputs())).logits)


def test_gated_lora_gate_replaces_scale():
    """With the gate fixed at g, gated LoRA equals ungated LoRA with scale g (official code: gate replaces α)."""
    gated = build("lora", gated=True)
    plain = build("lora", lora_scale=0.5)
    for module in list(gated.modules()) + list(plain.modules()):
        if hasattr(module, "lora_b"):
            torch.manual_seed(3)
            torch.nn.init.normal_(module.lora_a.weight)
            torch.nn.init.normal_(module.lora_b.weight)
        if isinstance(module, Gate):
            torch.nn.init.zeros_(module.linear.weight)
            torch.nn.init.zeros_(module.linear.bias)  # sigmoid(0) = 0.5
    torch.testing.assert_close(gated(*inputs()), plain(*inputs()))


def test_prefix_attention_matches_a_hand_written_reference():
    """One layer's attention with the prefix prepended, written out: softmax(q [Pk; K]ᵀ / √d + mask) [Pv; V]."""
    model = build("prefix", gated=False)
    wrapper = model.layers[0].attention.self
    assert isinstance(wrapper, PrefixSelfAttention)
    inner = wrapper.inner
    hidden = torch.randn(2, 5, 32)
    token_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    attention_mask = token_mask.bool()[:, None, None, :].expand(2, 1, 5, 5)
    model.members.prefixes = model.prefix_encoder()  # what PeltModel.forward computes once per batch
    out, _ = wrapper(hidden, attention_mask=attention_mask)

    def heads(x):
        return x.view(2, 5, 2, 16).transpose(1, 2)
    q, k, v = heads(inner.query(hidden)), heads(inner.key(hidden)), heads(inner.value(hidden))
    prefixes = model.members.prefixes
    key_values = prefixes.key_values
    assert [length for length, _, _ in prefixes.classes] == [10]  # one member, one prefix length
    pk, pv = key_values[0, :, 0].permute(1, 2, 0, 3)  # layer 0: (2, heads, L, head_dim)
    k = torch.cat([pk.expand(2, -1, -1, -1), k], dim=2)
    v = torch.cat([pv.expand(2, -1, -1, -1), v], dim=2)
    scores = q @ k.transpose(-1, -2) / 16**0.5
    visible = torch.cat([torch.ones(2, 10, dtype=torch.bool), token_mask.bool()], dim=1)[:, None, None, :]
    scores = scores.masked_fill(~visible, float("-inf"))
    expected = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_prefix_gate_scales_prefix_keys_and_values():
    """A closed prefix gate (g → 0) leaves zero-valued prefix keys/values: still attended (softmax), as the paper notes."""
    model = build("prefix", gated=True)
    for module in model.modules():
        if isinstance(module, Gate):
            torch.nn.init.constant_(module.linear.bias, -1e4)
    logits = model(*inputs())
    reference = _reference(model)
    assert not torch.allclose(logits, reference(*_as_kwargs(inputs())).logits)  # zero keys still take softmax mass


def test_model_seed_fixes_the_new_modules():
    first, second = build("unipelt_apl"), build("unipelt_apl")
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), name
    alone, inside = build("adapter"), build("unipelt_ap_nogate")
    torch.testing.assert_close(alone.layers[0].output.adapter.down.weight, inside.layers[0].output.adapter.down.weight)


def test_unknown_component_and_head_are_reported():
    with pytest.raises(ValueError, match="unknown component"):
        build("adapter", components=["adaptr"])
    with pytest.raises(ValueError, match="head must be one of"):
        build("adapter", head="yes")
    with pytest.raises(ValueError, match="lora_targets"):
        build("lora", lora_targets=["query", "output"])


def test_every_component_declares_its_gate():
    """A gated method needs a gate from each component: each declaration says what it multiplies, or None."""
    from peltbench.methods import COMPONENTS

    declared = {name: module.COMPONENT.gate for name, module in COMPONENTS.items()}
    assert all(gate is None or (isinstance(gate, str) and gate) for gate in declared.values()), declared
    assert {name for name in ("adapter", "prefix", "lora") if declared[name]} == {"adapter", "prefix", "lora"}
    assert all(declared[name] is None for name in ("full", "bitfit", "ln", "parallel_adapter"))


@pytest.mark.parametrize("without_gate", ["bitfit", "ln", "parallel_adapter"])
def test_gated_mixture_with_a_gateless_component_is_refused_in_one_line(without_gate):
    with pytest.raises(ValueError, match=f"component {without_gate} has no gate") as error:
        build("unipelt_apl", components=["prefix", without_gate], adapter_scale=1.0)
    assert "\n" not in str(error.value)



def _as_kwargs(triple):
    input_ids, mask, types = triple
    return input_ids, mask, types


def test_the_head_and_logits_stay_fp32_under_bf16_autocast():
    """bf16 logits would collapse a narrow band of regression predictions (STS-B) onto a few values."""
    model = build("unipelt_apl", num_labels=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(*inputs())
    assert logits.dtype == torch.float32
    expected = model(*inputs())
    assert not torch.equal(logits, expected.to(torch.bfloat16).float())  # finer than bf16's 8 bits of mantissa
    torch.testing.assert_close(logits, expected, rtol=0.05, atol=0.05)


def test_padded_gate_pooling_averages_over_every_position():
    """gate_pooling=padded (the authors' code): the mean over all positions of the batch as given (the runner
    pads it to max length), pads included; masked: over real tokens only."""
    padded, masked = build("unipelt_ap", gate_pooling="padded"), build("unipelt_ap")
    assert padded.members.padded_pooling and not masked.members.padded_pooling
    input_ids, mask, types = inputs(batch=2)
    gate = next(m for m in padded.modules() if isinstance(m, Gate))
    x = torch.randn(2, input_ids.shape[1], 32)
    per_token = torch.sigmoid(gate.linear(x)).squeeze(-1)
    padded.members.token_mask = mask
    torch.testing.assert_close(gate(x), per_token.mean(dim=1))
    masked_gate = next(m for m in masked.modules() if isinstance(m, Gate))
    masked.members.token_mask = mask
    expected = (per_token * mask).sum(1) / mask.sum(1)
    masked_gate.linear.load_state_dict(gate.linear.state_dict())
    torch.testing.assert_close(masked_gate(x), expected)
