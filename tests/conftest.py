"""Shared fixtures: a tiny BERT checkpoint (hidden 32, 2 layers) and small GLUE files, built here, offline."""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach the Hub
os.environ.setdefault("TQDM_DISABLE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_GLUE = REPO.parent / "shared" / "data" / "glue"  # every task's real files, where ../shared is beside the clone
SHIPPED_GLUE = REPO / "data" / "glue"                    # RTE, shipped with peltbench (data/glue/README.md)
WORDS = ("the a cat dog sat ran on mat log big small red blue good bad not very happy sad movie film "
         "is was it this that and or but with man woman car house tree runs sleeps").split()
TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=128, type_vocab_size=2)


def tiny_config(num_labels: int = 2):
    from transformers import BertConfig

    return BertConfig(num_labels=num_labels, **TINY)


def tiny_backbone(num_labels: int = 2, seed: int = 0):
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_config(num_labels)).eval()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A local BERT checkpoint directory: random tiny weights plus a word-level uncased vocabulary."""
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"[unused{i}]" for i in range(TINY["vocab_size"] - len(vocab))]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 takes the vocabulary itself; given only vocab_file= it builds a 5-token tokenizer (all [UNK])
    BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True).save_pretrained(folder)
    tiny_backbone().save_pretrained(folder)
    return folder


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))


def _rows(task: str, n: int, rng: random.Random) -> tuple[list[str] | None, list[list[str]]]:
    """(header, rows) in the real files' own column layout (see ../shared/data/glue/README.md)."""
    def label2() -> str:
        return str(rng.randint(0, 1))
    if task == "CoLA":
        return None, [["gj04", label2(), "", _sentence(rng)] for _ in range(n)]
    if task == "SST-2":
        return ["sentence", "label"], [[_sentence(rng) + " ", label2()] for _ in range(n)]
    if task == "MRPC":
        return (["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                [[label2(), str(i), str(i + 1), _sentence(rng), _sentence(rng)] for i in range(n)])
    if task == "STS-B":
        header = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"]
        return header, [[str(i), "main", "x", "2012", str(i), "none", "none", _sentence(rng), _sentence(rng),
                         f"{rng.uniform(0, 5):.3f}"] for i in range(n)]
    if task == "QQP":
        return (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                [[str(i), str(i), str(i), _sentence(rng), _sentence(rng), label2()] for i in range(n)])
    if task == "MNLI":
        header = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2", "gold_label"]
        labels = ["entailment", "neutral", "contradiction"]
        return header, [[str(i), "1", "1", "fiction", _sentence(rng), _sentence(rng), rng.choice(labels)] for i in range(n)]
    header = ["index", "question" if task == "QNLI" else "sentence1", "sentence" if task == "QNLI" else "sentence2", "label"]
    return header, [[str(i), _sentence(rng), _sentence(rng), rng.choice(["entailment", "not_entailment"])] for i in range(n)]


FOLDERS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE")
TRAIN_ROWS, TEST_ROWS = 60, 24


def write_glue(root: Path, train_rows: int = TRAIN_ROWS, test_rows: int = TEST_ROWS) -> Path:
    rng = random.Random(0)
    for folder in FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)
        test_file = "dev_matched.tsv" if folder == "MNLI" else "dev.tsv"
        for name, n in (("train.tsv", train_rows), (test_file, test_rows)):
            header, rows = _rows(folder, n, rng)
            with open(root / folder / name, "w", newline="") as handle:
                writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
                writer.writerows(([header] if header else []) + rows)
    return root


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory) -> Path:
    """Small GLUE files in the classic glue_data layout: 60 train and 24 dev rows per task."""
    return write_glue(tmp_path_factory.mktemp("glue_data"))


def compose_config(*overrides: str):
    """The real packaged config, composed as the `peltbench` command would."""
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def tiny_run_overrides(checkpoint: Path, glue: Path, results: Path) -> list[str]:
    """A run small enough for a test: k=16 with a 20-row dev set, 3 epochs, the tiny model."""
    return [f"model.name={checkpoint}", f"data.dir={glue}", f"results_dir={results}", "k=16", "dev_size=20",
            "train.epochs=3", "train.patience=2"]
