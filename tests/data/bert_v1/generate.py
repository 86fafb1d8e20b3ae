"""Generated once, at commit 91dbcec (before encoders other than BERT existed), and never again: what a BERT run
of every packaged method was then, so tests/test_bert_unchanged.py can check that the same run keeps its config
hash and folder and, with dropout off, its numbers.

    python tests/data/bert_v1/generate.py     # (from the repository root; writes identity.json and runs.json here)

identity.json: config_hash and record folder of each method on bert-base-uncased (plus a few changed settings).
runs.json: per method, the tiny dropout-free BERT run's per-epoch train loss, dev score, best epoch and test scores.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from conftest import compose_config, write_glue  # noqa: E402
from peltbench.packaged import options  # noqa: E402
from peltbench.record import config_hash, record_path  # noqa: E402

VARIANTS = [[], ["method.bottleneck=256"], ["method.lora_scale=4"], ["k=1000", "seed=555"], ["model_seed=7"],
            ["train.epochs=3", "dev_size=200"]]
TASKS = ["rte", "stsb", "mnli"]


def identities() -> dict:
    out = {}
    for method in sorted(options("method")):
        for task in TASKS:
            for variant in VARIANTS:
                overrides = [f"method={method}", f"task={task}", *variant]
                try:
                    cfg = compose_config(*overrides)
                    if variant == ["method.bottleneck=256"] and "bottleneck" not in cfg.method:
                        continue
                    if variant == ["method.lora_scale=4"] and "lora_scale" not in cfg.method:
                        continue
                except Exception:
                    continue
                out[" ".join(overrides)] = {"config_hash": config_hash(cfg),
                                            "path": str(record_path(cfg, Path("R")).relative_to("R"))}
    return out


def tiny_checkpoint(folder: Path) -> Path:
    """tests/test_bert_unchanged.py builds the same checkpoint: conftest's tiny BERT with dropout 0."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from conftest import TINY, WORDS

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"[unused{i}]" for i in range(TINY["vocab_size"] - len(vocab))]
    BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **TINY)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def runs() -> dict:
    from peltbench.runner import run_experiment

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoint = tiny_checkpoint(tmp / "ckpt")
        glue = write_glue(tmp / "glue")
        for method in sorted(options("method")):
            for task in (["rte", "stsb"] if method in ("lora", "unipelt_apl", "bitfit") else ["rte"]):
                cfg = compose_config(f"method={method}", f"task={task}", f"model.name={checkpoint}", f"data.dir={glue}",
                                     f"results_dir={tmp / 'runs'}", "k=16", "dev_size=20", "train.epochs=4",
                                     "train.patience=3", "logger=[]", "device=cpu")
                record = run_experiment(cfg)
                out[f"{method} {task}"] = {
                    "train_loss": [h["train_loss"] for h in record["history"]],
                    "dev_main": [h["dev_main"] for h in record["history"]],
                    "best_epoch": record["best_epoch"], "test": record["test"], "gates": record["gates"],
                    "trainable_params": record["trainable_params"], "optimizer_params": record["optimizer_params"],
                }
    return out


if __name__ == "__main__":
    (HERE / "identity.json").write_text(json.dumps(identities(), indent=1, sort_keys=True) + "\n")
    (HERE / "runs.json").write_text(json.dumps(runs(), indent=1, sort_keys=True) + "\n")
