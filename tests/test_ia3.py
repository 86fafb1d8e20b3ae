"""(IA)³ (methods/ia3.py) against PEFT 0.21's IA3 on every encoder, its counts, and its refusal in a gated mixture.

Tiny random models with O(1) weights (initializer_range 0.2), dropout off where outputs are compared; tolerances as in
tests/test_encoders.py (1e-5 relative / 1e-6 absolute).
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_encoder
from peltbench.methods import build_pelt_model, count_method, member_state, parameter_counts
from test_encoders import batch, build, method, model_inputs, same_logits_then_backward

ARCHITECTURES = ["bert", "roberta", "deberta-v2", "modernbert"]
O1 = {"initializer_range": 0.2}


def randomise_scales(model) -> None:
    """Scales away from their init of 1, so that each place matters."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("ia3_l"):
                parameter.copy_(1 + 0.5 * torch.randn(parameter.shape, generator=generator))


def peft_ia3(model_type: str, ours):
    """PEFT's IA3 on the paper's places, named exactly (a regex: PEFT's suffix `output.dense` would also match
    attention.output.dense), with our scales copied in; ModernBERT's keys and values are blocks of Wqkv, so PEFT
    scales all of Wqkv's output and its query block is set to 1."""
    from peft import IA3Config, get_peft_model

    fused = model_type == "modernbert"
    layers = r"model\.layers\.\d+\." if fused else rf"{ours.backbone.base_model_prefix}\.encoder\.layer\.\d+\."
    ffn = layers + (r"mlp\.Wo" if fused else r"output\.dense")
    names = ours.arch.projections
    attention = r"attn\.Wqkv" if fused else rf"attention\.self\.({names['key'][0]}|{names['value'][0]})"
    config = IA3Config(target_modules=f"{layers}({attention})|{ffn}", feedforward_modules=ffn)
    peft = get_peft_model(tiny_encoder(model_type, dropout=0.0, **O1), config)
    state = member_state(ours, 0)
    with torch.no_grad():
        for name, module in peft.named_modules():
            if not hasattr(module, "ia3_l") or "default" not in module.ia3_l:
                continue
            plain = name.removeprefix("base_model.model.")
            if plain.endswith("Wqkv"):
                key, value = state[f"{plain}.key.ia3_l"], state[f"{plain}.value.ia3_l"]
                vector = torch.cat([torch.ones_like(key), key, value])
            else:
                vector = state[f"{plain}.ia3_l"]
            module.ia3_l["default"].copy_(vector.view(module.ia3_l["default"].shape))
    return peft


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_ia3_equals_peft(model_type):
    """Logits, gradients of every scale, and the count: ours against PEFT's IA3 on the same places and values."""
    pytest.importorskip("peft")
    ours = build(model_type, method("ia3"), **O1).train()
    randomise_scales(ours)
    peft = peft_ia3(model_type, ours).train()
    grads = same_logits_then_backward(model_type, ours, peft, tiny_encoder(model_type, dropout=0.0, **O1))
    grads = {name: grad for name, grad in grads.items() if name.endswith("ia3_l")}  # the scales, not the head
    peft_counted, compared = 0, 0
    for name, module in peft.named_modules():
        if not hasattr(module, "ia3_l") or "default" not in module.ia3_l:
            continue
        plain = name.removeprefix("base_model.model.")
        grad = module.ia3_l["default"].grad.flatten()
        if plain.endswith("Wqkv"):  # only the key and value blocks are ours; PEFT's query block is not
            size = grad.numel() // 3
            torch.testing.assert_close(grads[f"{plain}.key.ia3_l"], grad[size : 2 * size], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(grads[f"{plain}.value.ia3_l"], grad[2 * size :], rtol=1e-5, atol=1e-6)
            peft_counted += 2 * size
            compared += 2
        else:
            torch.testing.assert_close(grads[f"{plain}.ia3_l"], grad, rtol=1e-5, atol=1e-6)
            peft_counted += grad.numel()
            compared += 1
    assert compared == len(grads) == 2 * 3  # 2 layers × (key, value, FFN)
    assert parameter_counts(ours)["trainable_params"] == peft_counted == 2 * (32 + 32 + 64)


def test_ia3_counts_the_papers_three_places_on_a_base_model():
    """roberta-base's shape (AutoConfig.for_model('roberta') defaults: H 768, 12 layers, FFN 3,072): 12 × (768 + 768
    + 3,072) = 55,296, the paper's (IA)³; PEFT's default mapping (+ attention.output.dense) would give 64,512."""
    from transformers import AutoConfig

    counts = count_method(method("ia3"), AutoConfig.for_model("roberta", num_labels=2))
    assert counts["trainable_params"] == 55_296
    assert counts["head_params"] == 768 * 768 + 768 + 768 * 2 + 2  # RoBERTa's classifier.dense + out_proj


def test_ia3_starts_as_the_pretrained_model_and_composes_with_lora():
    """At its init of 1 the model is the pretrained one; on the same projection as LoRA (key) it scales LoRA's output
    (LoRA installs first), and LoRA's own modules are still found under the scale."""
    ours = build("modernbert", method("ia3"), **O1)
    reference = tiny_encoder("modernbert", dropout=0.0, **O1)
    ids, mask, types = batch("modernbert")
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, types), reference(**model_inputs("modernbert", ids, mask, types)).logits,
                                   rtol=1e-5, atol=1e-6)
    mixture = method("ia3")
    mixture.components = ["ia3", "lora"]
    for key, value in method("lora", lora_targets=["query", "key", "value"]).items():
        if key not in mixture:
            mixture[key] = value
    model = build("bert", mixture, **O1)
    assert {n for n, _, _, _ in model.member_parameters() if "layer.0.attention.self.key" in n} == {
        "backbone.bert.encoder.layer.0.attention.self.key.ia3_l",
        "backbone.bert.encoder.layer.0.attention.self.key.inner.lora_a.weight",
        "backbone.bert.encoder.layer.0.attention.self.key.inner.lora_b.weight"}


def test_a_gated_mixture_with_ia3_is_refused_in_one_line():
    mixture = method("unipelt_ap")
    mixture.components = ["adapter", "prefix", "ia3"]
    with pytest.raises(ValueError, match=r"^method unipelt_ap: gated: true, but component ia3 has no gate .*: set gated: false or leave ia3 out$"):
        build_pelt_model(tiny_encoder("bert"), mixture, 42)


def saved_run_predicts_in_peltbench_and_peft(model_type, name, tmp_path, glue_dir):
    """A run with save.weights=true: load_run rescores it exactly, and its peft/ loaded by PeftModel.from_pretrained
    on the plain model gives the logits of the rebuilt run."""
    import peltbench
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    [outcome] = run_group(sweep(checkpoint, glue_dir, tmp_path / "runs", [name], False, "save.weights=true",
                                "train.epochs=2"))
    assert outcome.status == "ok" and "peft/adapter_model.safetensors" in outcome.record["saved"]
    run_dir = next((tmp_path / "runs").rglob("result.json")).parent
    loaded = peltbench.load_run(run_dir)
    assert loaded.predict()[0] == pytest.approx(outcome.record["test"], abs=1e-9)
    base = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    peft_model = PeftModel.from_pretrained(base, run_dir / "peft").eval()
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        ours = loaded.model(ids, mask, types)
        torch.testing.assert_close(peft_model(**model_inputs(model_type, ids, mask, types)).logits, ours,
                                   rtol=1e-5, atol=1e-6)
        plain = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2).eval()
        assert (ours - plain(**model_inputs(model_type, ids, mask, types)).logits).abs().max() > 1e-3  # it trained


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_a_saved_ia3_run_reloads_and_loads_in_peft(model_type, tmp_path, glue_dir):
    pytest.importorskip("peft")
    saved_run_predicts_in_peltbench_and_peft(model_type, "ia3", tmp_path, glue_dir)
