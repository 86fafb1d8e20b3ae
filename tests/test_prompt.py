"""Prompt tuning (methods/prompt.py) against PEFT 0.21's PromptTuningConfig on every encoder; counts, init, fusion.

Tiny random models with O(1) weights (initializer_range 0.2), dropout off where outputs are compared; tolerances as in
tests/test_encoders.py (1e-5 relative / 1e-6 absolute).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, tiny_encoder
from peltbench.fusion import plan_groups
from peltbench.methods import build_pelt_model, count_method, member_state, parameter_counts
from test_encoders import batch, build, method, model_inputs

ARCHITECTURES = ["bert", "roberta", "deberta-v2", "modernbert"]
O1 = {"initializer_range": 0.2}


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_prompt_equals_peft(model_type):
    """Logits (padded rows included), the prompts' gradient and the count equal PEFT's prompt tuning with our
    prompts copied in: positions, token types, mask and pooling as PEFT's PeftModelForSequenceClassification has them."""
    pytest.importorskip("peft")
    from peft import PromptTuningConfig, get_peft_model

    ours = build(model_type, method("prompt"), **O1).train()
    peft = get_peft_model(tiny_encoder(model_type, dropout=0.0, **O1),
                          PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=20)).train()
    embedding = peft.prompt_encoder["default"].embedding.weight
    with torch.no_grad():
        embedding.copy_(member_state(ours, 0)["prompt.embedding"])
    ids, mask, types = batch(model_type)
    labels = torch.tensor([0, 1, 1])
    logits = ours(ids, mask, types)
    peft_logits = peft(**model_inputs(model_type, ids, mask, types)).logits
    torch.testing.assert_close(logits, peft_logits, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        plain = tiny_encoder(model_type, dropout=0.0, **O1)(**model_inputs(model_type, ids, mask, types)).logits
    assert (plain - logits).abs().max() > 1e-2  # the prompts matter
    F.cross_entropy(logits, labels).backward()
    F.cross_entropy(peft_logits, labels).backward()
    [parameter] = [p for n, p, _, _ in ours.member_parameters() if n.startswith("prompt.")]
    torch.testing.assert_close(parameter.grad[0], embedding.grad, rtol=1e-5, atol=1e-6)
    assert parameter_counts(ours)["trainable_params"] == embedding.numel() == 20 * 32


def test_prompt_counts_p_times_the_embedding_width():
    """roberta-base's shape: 20 × 768 = 15,360; ELECTRA's prompts have its embeddings' width (16 on the tiny config,
    below its hidden 32), as PEFT's token_dim."""
    from transformers import AutoConfig

    assert count_method(method("prompt"), AutoConfig.for_model("roberta", num_labels=2))["trainable_params"] == 15_360
    assert parameter_counts(build("electra", method("prompt")))["trainable_params"] == 20 * 16


def test_prompt_inits():
    """vocab (the default): rows of the word embeddings, as PEFT's SAMPLE_VOCAB; random: N(0, 1), as PEFT's RANDOM."""
    model = build("bert", method("prompt"), **O1)
    words = model.encoder.get_input_embeddings().weight
    prompts = member_state(model, 0)["prompt.embedding"]
    assert all(any(torch.equal(row, word) for word in words) for row in prompts)
    random = member_state(build("bert", method("prompt", prompt_init="random")), 0)["prompt.embedding"]
    assert 0.8 < random.std() < 1.2 and not any(torch.equal(random[0], word) for word in words)


def test_prompt_runs_fuse_only_with_runs_of_their_prompt_length():
    """Prompts shift positions: a group holds prompt runs of one length; build_pelt_model refuses any other mixture."""
    names = ["prompt", "lora", "prompt", "prompt"]
    cfgs = [compose_config(f"method={name}", "task=rte", "fuse=true") for name in names]
    cfgs[3].method.prompt_length = 8
    assert plan_groups(cfgs) == [[0, 2], [1], [3]]
    for other in (method("lora"), method("prompt", prompt_length=8)):
        with pytest.raises(ValueError, match="a group's members must all have one prompt length"):
            build_pelt_model(tiny_encoder("bert"), [method("prompt"), other], [42, 42])


def test_a_gated_mixture_with_prompts_is_refused_in_one_line():
    mixture = method("unipelt_ap")
    mixture.components = ["adapter", "prompt"]
    mixture.prompt_length, mixture.prompt_init = 20, "vocab"
    with pytest.raises(ValueError, match=r"^method unipelt_ap: gated: true, but component prompt has no gate"):
        build_pelt_model(tiny_encoder("bert"), mixture, 42)


@pytest.mark.parametrize("model_type", ["bert", "deberta-v2"])
def test_a_saved_prompt_run_reloads_and_loads_in_peft(model_type, tmp_path, glue_dir):
    pytest.importorskip("peft")
    from test_ia3 import saved_run_predicts_in_peltbench_and_peft

    saved_run_predicts_in_peltbench_and_peft(model_type, "prompt", tmp_path, glue_dir)
