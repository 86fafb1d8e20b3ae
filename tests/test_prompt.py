"""Prompt tuning (methods/prompt.py): its inits, fusion, refusal in a gated mixture, a saved run. Against PEFT 0.21's
PromptTuningConfig on every encoder (logits, padded rows included, the prompts' gradient, counts, the PEFT copy):
tests/test_peft_matrix.py.

Tiny random models with O(1) weights (initializer_range 0.2).
"""

from __future__ import annotations

import pytest
import torch

from conftest import compose_config, tiny_encoder
from peltbench.fusion import plan_groups
from peltbench.methods import build_pelt_model, member_state
from test_encoders import build, method

O1 = {"initializer_range": 0.2}


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
def test_a_saved_prompt_run_reloads(model_type, tmp_path, glue_dir):
    from test_ia3 import saved_run_reloads

    saved_run_reloads(model_type, "prompt", tmp_path, glue_dir)
