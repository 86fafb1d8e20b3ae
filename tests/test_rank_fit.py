"""A rank above what the adapted projections can take is refused from the config alone, before torch (issue 40, 5:
`method.lora_rank=1000` on a 384-wide MiniLM trained for 196 s; `method.hra_rank=500` loaded the model and trained).
The rule is config.RANKS: an update B·A of rank r on an out × in matrix has rank at most min(in, out); HRA's r
reflections are vectors of the input size. VeRA's r is not bounded (the paper's r = 1024 on 768-wide projections)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import compose_config
from peltbench import UserError
from peltbench.config import ModelMisfit, check_config, check_model_fit

BERT = {"model_type": "bert", "hidden_size": 32, "intermediate_size": 64, "max_position_embeddings": 128}


@pytest.mark.parametrize("method,key", [
    ("lora", "lora_rank"), ("dora", "lora_rank"), ("lora_fa", "lora_rank"), ("unipelt_apl", "lora_rank"),
    ("unipelt_apl_nogate", "lora_rank"), ("adalora", "adalora_init_rank"), ("delora", "delora_rank"),
])
def test_a_rank_above_the_projections_width_is_refused_before_torch(tiny_checkpoint, method, key):
    assert json.loads((tiny_checkpoint / "config.json").read_text())["hidden_size"] == 32
    run = ("task=rte", f"model.name={tiny_checkpoint}", f"method={method}")
    message = (f"method={method} task=rte: {key}=33 is above the adapted query's width: its 32 × 32 weight has rank at "
               f"most 32, so a larger update only adds parameters; set method.{key}=32 or lower (bert hidden_size 32)")
    with pytest.raises(ModelMisfit, match=re.escape(message)):
        check_config(compose_config(*run, f"method.{key}=33"))
    check_config(compose_config(*run, f"method.{key}=32"))  # full rank: allowed


def test_hras_reflections_are_bounded_by_the_input_size(tiny_checkpoint):
    run = ("task=rte", f"model.name={tiny_checkpoint}", "method=hra")
    with pytest.raises(ModelMisfit, match=re.escape(
            "method=hra task=rte: hra_rank=33 is above the adapted query's input size 32: its reflections are vectors "
            "of that size, and more than 32 add nothing; set method.hra_rank=32 or lower (bert hidden_size 32)")):
        check_config(compose_config(*run, "method.hra_rank=33"))
    check_config(compose_config(*run, "method.hra_rank=32"))


def test_veras_rank_may_exceed_the_width_as_in_its_paper(tiny_checkpoint):
    """VeRA's r is the width of frozen random projections (λ_d trains r scalars): its paper runs r = 1024 on
    RoBERTa-base's 768-wide q and v, and vera.yaml's default is that."""
    check_config(compose_config("task=rte", f"model.name={tiny_checkpoint}", "method=vera"))  # r = 1024 on 32
    check_config(compose_config("task=rte", f"model.name={tiny_checkpoint}", "method=vera", "method.vera_rank=4096"))


def test_each_adapted_linear_bounds_the_rank_by_its_own_sizes():
    """AdaLoRA adapts the FFN's Linears too: the intermediate one is hidden → intermediate_size (2 × it for
    ModernBERT's GLU), the output one intermediate_size → hidden; the smaller side bounds the rank."""
    narrow = {**BERT, "intermediate_size": 16}  # an FFN narrower than the attention
    intermediate = ("method=adalora", "task=rte", "method.adalora_targets=[intermediate]", "method.adalora_init_rank=20")
    with pytest.raises(UserError, match=re.escape(
            "adalora_init_rank=20 is above the adapted intermediate's width: its 16 × 32 weight has rank at most 16, so "
            "a larger update only adds parameters; set method.adalora_init_rank=16 or lower (bert hidden_size 32, "
            "intermediate_size 16)")):
        check_model_fit(compose_config(*intermediate), narrow)
    with pytest.raises(UserError, match=re.escape("adapted output's width: its 32 × 16 weight has rank at most 16")):
        check_model_fit(compose_config("method=adalora", "task=rte", "method.adalora_targets=[output]",
                                       "method.adalora_init_rank=20"), narrow)
    check_model_fit(compose_config(*intermediate), BERT)  # 32 × 64: 20 fits
    check_model_fit(compose_config("method=adalora", "task=rte", "method.adalora_targets=[query]",
                                   "method.adalora_init_rank=20"), narrow)  # the attention's 32 × 32
    glu = {"model_type": "modernbert", "hidden_size": 32, "intermediate_size": 16}  # Wi: 32 → 2 · 16
    check_model_fit(compose_config(*intermediate, "method.adalora_init_rank=32"), glu)
    with pytest.raises(UserError, match=re.escape("its 32 × 32 weight has rank at most 32")):
        check_model_fit(compose_config(*intermediate, "method.adalora_init_rank=33"), glu)


def test_a_hub_model_not_cached_is_checked_once_its_config_is_loaded():
    """Without a config.json on disk check_config cannot tell; the runner calls check_model_fit with the loaded
    config (before any weights), which refuses the same."""
    cfg = compose_config("method=lora", "task=rte", "model.name=someone/uncached", "method.lora_rank=1000")
    check_config(cfg)
    with pytest.raises(ModelMisfit, match=re.escape("lora_rank=1000 is above the adapted query's width: its 384 × 384")):
        check_model_fit(cfg, {**BERT, "hidden_size": 384})


def test_the_issues_run_is_one_line_before_torch(tmp_path, tiny_checkpoint):
    """`peltbench method=lora method.lora_rank=1000` (and a sweep with one such member) ends in one line, before
    torch or transformers are imported, and starts nothing."""
    script = ("import sys; from peltbench.cli import main\n"
              "sys.argv = ['peltbench', *sys.argv[1:]]\n"
              "try:\n    main()\nexcept SystemExit as exit:\n"
              "    print(exit.code, sorted({'torch', 'transformers'} & set(sys.modules)))")
    for overrides in (("method=lora", "method.lora_rank=1000"), ("-m", "method=hra", "method.hra_rank=8,500")):
        result = subprocess.run([sys.executable, "-c", script, *overrides, "task=sst2", f"model.name={tiny_checkpoint}"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.stdout == "2 []\n", result.stdout + result.stderr
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(
            f"peltbench: error: method={overrides[-2].split('=')[1]} task=sst2: "), result.stderr
        assert list(tmp_path.iterdir()) == []  # nothing started
