"""(IA)³ (methods/ia3.py): its counts, its start, with LoRA, its refusal in a gated mixture, a saved run. Against PEFT
0.21's IA3 on every encoder (logits, gradients, counts, the PEFT copy): tests/test_peft_matrix.py.

Tiny random models with O(1) weights (initializer_range 0.2), dropout off where outputs are compared; tolerances as in
tests/test_encoders.py (1e-5 relative / 1e-6 absolute).
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_encoder
from peltbench.methods import build_pelt_model, count_method
from test_encoders import batch, build, method, model_inputs

O1 = {"initializer_range": 0.2}


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


def saved_run_reloads(model_type, name, tmp_path, glue_dir):
    """A run with save.weights=true writes its PEFT copy too (which loads in PEFT with our logits:
    tests/test_peft_matrix.py); load_run rescores it exactly, and it trained."""
    import peltbench
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
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        ours = loaded.model(ids, mask, types)
        plain = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2).eval()
        assert (ours - plain(**model_inputs(model_type, ids, mask, types)).logits).abs().max() > 1e-3  # it trained


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_a_saved_ia3_run_reloads(model_type, tmp_path, glue_dir):
    saved_run_reloads(model_type, "ia3", tmp_path, glue_dir)
