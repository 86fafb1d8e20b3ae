"""Loading GLUE from every source, the seeded few-shot split, tokenisation and batches."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import SHARED_GLUE, SHIPPED_GLUE, TEST_ROWS, TRAIN_ROWS, compose_config, write_glue
from peltbench import UserError
from peltbench.data import collate_group, encode, few_shot_split, load_split, read_file
from peltbench.packaged import options
from peltbench.tasks import TaskSpec


def spec(name: str) -> TaskSpec:
    return TaskSpec.from_config(compose_config("method=ft", f"task={name}").task)


def read_tsv(path, task: TaskSpec):
    """One glue_data TSV file, read as the task's first layout (glue_data's) reads it."""
    return read_file(path, task.files[0], task)


@pytest.mark.parametrize("seed", [111, 222, 333, 444, 555])
def test_split_is_the_numpy_permutation(seed):
    train, dev = few_shot_split(8551, 100, seed, 1000)
    permutation = np.random.default_rng(seed).permutation(8551)
    assert train.tolist() == permutation[:100].tolist()
    assert dev.tolist() == permutation[100:1100].tolist()


def test_split_equals_datasets_shuffle():
    """METHODS.md: the permutation is exactly what `datasets.Dataset.shuffle(seed=s)` selects."""
    import datasets

    shuffled = datasets.Dataset.from_dict({"row": list(range(2490))}).shuffle(seed=222)
    train, dev = few_shot_split(2490, 500, 222, 1000)
    assert train.tolist() == shuffled["row"][:500]
    assert dev.tolist() == shuffled["row"][500:1500]


def test_split_too_large_names_the_sizes():
    with pytest.raises(UserError, match=r"k=2000 is too large: the train split has 2490 rows.*2000 \+ 1000"):
        few_shot_split(2490, 2000, 111, 1000)


@pytest.mark.parametrize("task", options("task"))
def test_every_task_loads_from_the_glue_data_layout(task, glue_dir):
    train = load_split(spec(task), str(glue_dir), "train")
    test = load_split(spec(task), str(glue_dir), "test")
    assert len(train) == TRAIN_ROWS and len(test) == TEST_ROWS
    assert len(train.texts) == (1 if task in ("cola", "sst2") else 2)
    if task == "stsb":
        assert train.labels.dtype == np.float32 and 0 <= train.labels.min() and train.labels.max() <= 5
    else:
        assert set(train.labels.tolist()) <= set(range(spec(task).num_labels))


def test_string_labels_map_to_hub_ids(glue_dir):
    """RTE/QNLI: entailment 0, not_entailment 1; MNLI: entailment 0, neutral 1, contradiction 2 (the Hub's ids)."""
    rows = (glue_dir / "MNLI" / "train.tsv").read_text().splitlines()[1:]
    gold = [r.split("\t")[-1] for r in rows]
    labels = load_split(spec("mnli"), str(glue_dir), "train").labels
    assert [["entailment", "neutral", "contradiction"][i] for i in labels] == gold


def test_parquet_layout_reads_the_same_rows(glue_dir, tmp_path):
    """The layout `hf download nyu-mll/glue` writes: <dir>/<config>/<split>-*.parquet, Hub column names."""
    tsv = load_split(spec("rte"), str(glue_dir), "train")
    (tmp_path / "rte").mkdir()
    frame = pd.DataFrame({"sentence1": tsv.texts[0], "sentence2": tsv.texts[1], "label": tsv.labels, "idx": range(len(tsv))})
    frame.iloc[:30].to_parquet(tmp_path / "rte" / "train-00000-of-00002.parquet")
    frame.iloc[30:].to_parquet(tmp_path / "rte" / "train-00001-of-00002.parquet")
    parquet = load_split(spec("rte"), str(tmp_path), "train")
    assert parquet.texts == tsv.texts and parquet.labels.tolist() == tsv.labels.tolist()
    with pytest.raises(UserError, match=r"data file not found: .*rte/validation-\*\.parquet"):
        load_split(spec("rte"), str(tmp_path), "test")


def test_hub_loading_asks_for_nyu_mll_glue(monkeypatch):
    """The default source: datasets.load_dataset("nyu-mll/glue", <config>, split=...), MNLI tested on matched."""
    import datasets

    calls = []

    def fake_load_dataset(path, name, split):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict({"premise": ["a b"], "hypothesis": ["c"], "label": [2], "idx": [0]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    load_split.cache_clear()
    train = load_split(spec("mnli"), None, "train")
    load_split(spec("mnli"), None, "test")
    assert calls == [("nyu-mll/glue", "mnli", "train"), ("nyu-mll/glue", "mnli", "validation_matched")]
    assert train.texts == (["a b"], ["c"]) and train.labels.tolist() == [2]
    load_split.cache_clear()


def test_hub_failure_is_one_clear_line(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    load_split.cache_clear()
    with pytest.raises(UserError, match=r"^could not load nyu-mll/glue/cola \(train\) from the Hugging Face Hub or the local "
                                        r"datasets cache: Couldn't reach 'nyu-mll/glue' on the Hub \(LocalEntryNotFoundError\)\. "
                                        r"Offline\? Point data.dir at a local copy of its files \(README: Offline use\)\.$"):
        load_split(spec("cola"), None, "train")
    load_split.cache_clear()


def test_missing_file_and_directory(tmp_path):
    write_glue(tmp_path, 30, 10)
    (tmp_path / "CoLA" / "dev.tsv").unlink()
    load_split.cache_clear()
    with pytest.raises(UserError, match=f"data file not found: {tmp_path}/CoLA/dev.tsv"):
        load_split(spec("cola"), str(tmp_path), "test")
    shutil.rmtree(tmp_path / "RTE")
    with pytest.raises(UserError, match=r"no rte data under .*expected .*RTE/train.tsv or .*rte/train-\*\.parquet; or "
                                        r"leave data.dir unset: task rte reads nyu-mll/glue/rte with datasets"):
        load_split(spec("rte"), str(tmp_path), "train")
    with pytest.raises(UserError, match="no such directory"):
        load_split(spec("rte"), str(tmp_path / "nowhere"), "train")


def test_a_task_folder_spelt_in_another_case_is_named_with_the_expected_one(tmp_path):
    write_glue(tmp_path, 30, 10)
    (tmp_path / "RTE").rename(tmp_path / "rte")  # the parquet layout's name, holding glue_data's TSV files
    (tmp_path / "SST-2").rename(tmp_path / "sst-2")
    load_split.cache_clear()
    with pytest.raises(UserError, match=rf"^no rte data under {tmp_path} \(data.dir\): expected {tmp_path}/RTE/train.tsv or "
                                        rf"{tmp_path}/rte/train-\*\.parquet; found rte/train.tsv: rename it \(file and "
                                        r"folder names are case-sensitive\)$"):
        load_split(spec("rte"), str(tmp_path), "train")
    with pytest.raises(UserError, match=r"^no sst2 data under .*: expected .*/SST-2/train.tsv or .*/sst2/train-\*\.parquet; "
                                        r"found sst-2/train.tsv: rename it"):
        load_split(spec("sst2"), str(tmp_path), "train")
    (tmp_path / "rte").rename(tmp_path / "RTE")
    assert len(load_split(spec("rte"), str(tmp_path), "train").labels) == 30


def test_malformed_rows_name_file_and_line(tmp_path):
    write_glue(tmp_path, 30, 10)
    path = tmp_path / "MRPC" / "train.tsv"
    lines = path.read_text().splitlines()
    lines[4] = "\t".join(lines[4].split("\t")[:3])  # a row cut short
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"malformed row in .*MRPC/train.tsv, line 5: expected 5 tab-separated fields, found 3"):
        read_tsv(path, spec("mrpc"))
    path = tmp_path / "RTE" / "train.tsv"
    path.write_text(path.read_text().replace("not_entailment", "maybe", 1))
    with pytest.raises(UserError, match=r"RTE/train.tsv, line \d+: label 'maybe' is not valid for rte"):
        read_tsv(path, spec("rte"))


# The official checksums of CoLA.zip's and RTE.zip's members, and SST-2's (../shared/data/glue/SHA256SUMS).
SHIPPED_SUMS = {
    "CoLA/dev.tsv": "8c013e21dc39957cac37378d87bebe225b694a0d5fe13eded66c2856628833fd",
    "CoLA/train.tsv": "cb368ebeb9f27d7ad03720d27ddc95687a311bdb100781a2fe59a5f5b1bc0624",
    "RTE/dev.tsv": "80230dfa1347282e7b532b06a1004a76a710087541189bf874223ddf0e3819fb",
    "RTE/train.tsv": "41e3a9b063433392343fad9e962cf2f58b681c78d8f71592f4186f0837246c5c",
    "SST-2/dev.tsv": "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0",
    "SST-2/train.tsv": "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1",
}


@pytest.mark.parametrize("task,train_rows,test_rows", [("cola", 8551, 1043), ("sst2", 67349, 872), ("rte", 2490, 277)])
def test_the_shipped_glue_files_are_the_official_ones(task, train_rows, test_rows):
    """data/glue: its SHA256SUMS lists the official files' checksums, the files match them, GLUE's row counts."""
    import hashlib

    sums = dict(reversed(line.split("  ")) for line in (SHIPPED_GLUE / "SHA256SUMS").read_text().splitlines())
    assert sums == SHIPPED_SUMS
    folder = spec(task).files[0].train.split("/")[0]
    for name in (f"{folder}/train.tsv", f"{folder}/dev.tsv"):
        assert hashlib.sha256((SHIPPED_GLUE / name).read_bytes()).hexdigest() == sums[name], name
    assert len(load_split(spec(task), str(SHIPPED_GLUE), "train")) == train_rows
    assert len(load_split(spec(task), str(SHIPPED_GLUE), "test")) == test_rows


@pytest.mark.skipif(not SHARED_GLUE.is_dir(), reason="../shared/data/glue is not beside the checkout")
@pytest.mark.parametrize("task,train_rows,test_rows", [
    ("cola", 8551, 1043), ("sst2", 67349, 872), ("mrpc", 3668, 408), ("stsb", 5749, 1500), ("rte", 2490, 277),
])
def test_real_glue_files_load_completely(task, train_rows, test_rows):
    """Row counts from ../shared/data/glue/README.md (the official sizes)."""
    assert len(load_split(spec(task), str(SHARED_GLUE), "train")) == train_rows
    assert len(load_split(spec(task), str(SHARED_GLUE), "test")) == test_rows


def test_encoding_is_memoised_and_batches_pad_dynamically(glue_dir, tiny_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    split = load_split(spec("mrpc"), str(glue_dir), "train")
    first = encode(split, [3, 1, 2], tokenizer, 128)
    cached = dict(split.encodings[(tokenizer.name_or_path, 128)])
    again = encode(split, [2, 3], tokenizer, 128)
    assert again.input_ids == [first.input_ids[2], first.input_ids[0]]
    assert split.encodings[(tokenizer.name_or_path, 128)] == cached  # nothing tokenised twice
    assert first.token_type_ids[0].count(1) > 0  # sentence pairs get segment ids
    batch = collate_group([first], [[0, 1, 2]], tokenizer.pad_token_id, torch.device("cpu"))
    longest = max(len(ids) for ids in first.input_ids)
    assert batch["input_ids"].shape == (3, longest)
    assert batch["attention_mask"].sum(1).tolist() == [len(ids) for ids in first.input_ids]
    assert encode(split, [0], tokenizer, 6).input_ids[0].__len__() <= 6  # truncation to max_length


def test_evaluation_batches_are_length_sorted_and_cover_every_row(glue_dir, tiny_checkpoint):
    from transformers import AutoTokenizer

    from peltbench.train import EvaluationSet, GroupSettings

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    split = load_split(spec("sst2"), str(glue_dir), "test")
    encoded = encode(split, range(len(split)), tokenizer, 128)
    evaluation = EvaluationSet(encoded, GroupSettings(eval_batch_size=5, pad_id=tokenizer.pad_token_id))
    assert sorted(evaluation.order) == list(range(len(split)))
    lengths = [len(encoded.input_ids[r]) for r in evaluation.order]
    assert lengths == sorted(lengths)
    # each batch on the host: (input ids, attention mask, token types) × rows × width
    assert [b.shape[1] for b in evaluation.batches] == [5] * (len(split) // 5) + [len(split) % 5] * bool(len(split) % 5)
    widths = [b[1].sum(1).max() for b in evaluation.batches]
    assert [b.shape[2] for b in evaluation.batches] == widths  # each batch padded to its own longest row


# ---------------------------------------------------------------- labels checked everywhere, files named

def replace_label(path, line: int, label: str) -> None:
    """Set the label (last column) of 1-based `line` of a TSV written by write_glue."""
    lines = path.read_text().splitlines()
    fields = lines[line - 1].split("\t")
    fields[-1 if path.parent.name != "CoLA" else 1] = label
    lines[line - 1] = "\t".join(fields)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("file", ["train.tsv", "dev.tsv"])
@pytest.mark.parametrize("label,problem", [("nan", "not a finite number"), ("inf", "not a finite number"),
                                           ("-inf", "not a finite number"), ("5.2", "valid: 0 to 5"),
                                           ("-0.5", "valid: 0 to 5")])
def test_a_bad_stsb_score_names_file_and_line(tmp_path, file, label, problem):
    write_glue(tmp_path, 30, 10)
    replace_label(tmp_path / "STS-B" / file, 7, label)
    load_split.cache_clear()
    with pytest.raises(UserError) as error:
        load_split(spec("stsb"), str(tmp_path), "train" if file == "train.tsv" else "test")
    assert str(error.value) == (f"malformed row in {tmp_path / 'STS-B' / file}, line 7: label {float(label)!r} is not "
                                f"valid for stsb ({problem})")


def test_a_class_label_out_of_range_names_file_and_line(tmp_path):
    write_glue(tmp_path, 30, 10)
    replace_label(tmp_path / "CoLA" / "dev.tsv", 4, "2")
    with pytest.raises(UserError, match=r"CoLA/dev.tsv, line 4: label 2 is not valid for cola \(valid: 0 to 1\)$"):
        read_tsv(tmp_path / "CoLA" / "dev.tsv", spec("cola"))
    replace_label(tmp_path / "CoLA" / "dev.tsv", 4, "nan")
    with pytest.raises(UserError, match=r"CoLA/dev.tsv, line 4: label nan is not valid for cola \(not a finite number\)$"):
        read_tsv(tmp_path / "CoLA" / "dev.tsv", spec("cola"))


def test_parquet_and_hub_labels_name_the_file_or_split_and_row(tmp_path, monkeypatch):
    import datasets

    (tmp_path / "stsb").mkdir()
    frame = pd.DataFrame({"sentence1": ["a b"] * 6, "sentence2": ["c"] * 6, "label": [1.0, 2.0, 3.0, np.nan, 4.0, 0.5]})
    frame.iloc[:3].to_parquet(tmp_path / "stsb" / "validation-00000-of-00002.parquet")
    frame.iloc[3:].to_parquet(tmp_path / "stsb" / "validation-00001-of-00002.parquet")
    with pytest.raises(UserError, match=r"stsb/validation-00001-of-00002.parquet, row index 0: label null is not valid "
                                        r"for stsb \(empty: every row of the task needs a label\)$"):
        load_split(spec("stsb"), str(tmp_path), "test")

    monkeypatch.setattr(datasets, "load_dataset", lambda path, name, split: datasets.Dataset.from_dict(
        {"sentence": ["a b", "c d"], "label": [1, -1], "idx": [0, 1]}))
    load_split.cache_clear()
    with pytest.raises(UserError, match=r"^nyu-mll/glue/cola \(validation split\), row index 1: label -1 is not valid "
                                        r"for cola \(valid: 0 to 1, an unlabelled test split\?\)$"):
        load_split(spec("cola"), None, "test")
    load_split.cache_clear()


def test_a_header_only_or_empty_file_is_named(tmp_path):
    write_glue(tmp_path, 30, 10)
    dev = tmp_path / "RTE" / "dev.tsv"
    dev.write_text(dev.read_text().splitlines()[0] + "\n")
    with pytest.raises(UserError, match=rf"^{dev}: no data rows \(only a header\)$"):
        read_tsv(dev, spec("rte"))
    (tmp_path / "CoLA" / "dev.tsv").write_text("")
    with pytest.raises(UserError, match=r"CoLA/dev.tsv: no data rows$"):
        read_tsv(tmp_path / "CoLA" / "dev.tsv", spec("cola"))


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    write_glue(tmp_path, 30, 10)
    path = tmp_path / "SST-2" / "train.tsv"
    lines = path.read_bytes().split(b"\n")
    lines[2] = "caf\xe9 is good\t1".encode("latin-1")
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(UserError, match=rf"^{path}: not UTF-8 text \(byte 0xe9 on line 3\); task files are UTF-8$"):
        read_tsv(path, spec("sst2"))


def test_a_broken_parquet_file_is_named(tmp_path):
    (tmp_path / "rte").mkdir()
    (tmp_path / "rte" / "train-00000-of-00001.parquet").write_bytes(b"PAR1 cut off")
    with pytest.raises(UserError, match=r"rte/train-00000-of-00001.parquet: not a readable parquet file \("):
        load_split(spec("rte"), str(tmp_path), "train")


def test_full_halves_refuses_a_glue_dev_of_one_row_in_one_line(tiny_checkpoint, tmp_path):
    """Issue 26, 5: a one-row dev file under protocol=full_halves left one part empty and failed in torch.cat."""
    from peltbench.data import dev_halves
    from peltbench.runner import run_group

    glue = write_glue(tmp_path / "glue", train_rows=30, test_rows=1)
    cfg = compose_config("method=lora", "task=rte", "protocol=full_halves", f"model.name={tiny_checkpoint}",
                         f"data.dir={glue}", f"results_dir={tmp_path / 'results'}", "train.epochs=1")
    [outcome] = run_group([cfg])
    assert outcome.status == "error" and str(outcome.error) == (
        f"rte's test set (tsv:{glue}/RTE) has 1 row: protocol full_halves splits it in two (one part selects the "
        f"epoch, the other is reported), so it needs at least 2")
    assert not list((tmp_path / "results").rglob("result.json"))
    assert [part.tolist() for part in dev_halves(2, seed=42)] in ([[0], [1]], [[1], [0]])  # 2 rows: one each


def test_check_task_data_reads_and_checks_both_splits_as_load_split_does(tmp_path):
    """The sweep's preflight (peltbench.cli) asks it for each task before the first run: the rows a run reads."""
    from peltbench.data import check_task_data

    write_glue(tmp_path, 30, 10)
    check_task_data(spec("mnli"), str(tmp_path))
    (tmp_path / "MNLI" / "dev_matched.tsv").unlink()  # MNLI's test split: matched
    load_split.cache_clear()
    with pytest.raises(UserError, match=f"^task=mnli: data file not found: {tmp_path}/MNLI/dev_matched.tsv \\(under data.dir\\)$"):
        check_task_data(spec("mnli"), str(tmp_path))
    (tmp_path / "parquet" / "rte").mkdir(parents=True)
    (tmp_path / "parquet" / "rte" / "train-00000-of-00001.parquet").write_bytes(b"")
    with pytest.raises(UserError, match=r"^task=rte: .*/parquet/rte/train-00000-of-00001.parquet: not a readable parquet"):
        check_task_data(spec("rte"), str(tmp_path / "parquet"))
    with pytest.raises(UserError, match=r"^task=cola: no cola data under .*: expected .*/CoLA/train.tsv or "):
        check_task_data(spec("cola"), str(tmp_path / "parquet"))
