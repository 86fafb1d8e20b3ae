"""A sentence encoder's embeddings, as sentence-transformers computes them, without the package: the demonstration
filter's (peltbench/demonstrations.py, LM-BFF's SBERT filter, `objective.demo_filter`). The encoder is a checkpoint
folder (the installed all-MiniLM-L6-v2 serves offline); its pooling is read from its `1_Pooling/config.json`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import UserError
from .progress import progress

POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}


def row_text(texts: Sequence[str]) -> str:
    """What the filter embeds of a row: its sentence, or its two joined by a space (LM-BFF's
    tools/get_sbert_embedding.py, e.g. RTE's `line[1] + ' ' + line[2]`)."""
    return " ".join(texts)


def sentence_pooling(folder: Path) -> str:
    """How a sentence encoder's folder pools its tokens: its sentence-transformers `1_Pooling/config.json` (mean, the
    first token or the max), or the mean where it has none (LM-BFF's `*-nli-stsb-mean-tokens` encoders)."""
    config = folder / "1_Pooling" / "config.json"
    if not config.is_file():
        return "mean"
    modes = [mode for key, mode in POOLING_MODES.items() if json.loads(config.read_text()).get(key)]
    if len(modes) != 1:
        raise UserError(f"objective.demo_filter={folder}: its 1_Pooling/config.json pools by "
                        f"{' and '.join(modes) or 'no mode peltbench reads'}; the filter reads one of mean, cls, max")
    return modes[0]


def sentence_embeddings(path: str, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """The embeddings (rows, dim) of `texts` by the sentence encoder in folder `path`, as sentence-transformers
    computes them (without the package: transformers' AutoModel, then its pooling, `sentence_pooling`; inputs cut at
    its `sentence_bert_config.json` max_seq_length where it has one). Shortest texts first, in batches, on the CPU."""
    folder = Path(os.path.expanduser(str(path)))
    if not (folder / "config.json").is_file():
        raise UserError(f"objective.demo_filter={path}: not a checkpoint folder (no config.json there); give the "
                        f"folder of a sentence encoder, e.g. all-MiniLM-L6-v2's")
    mode = sentence_pooling(folder)
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    settings = folder / "sentence_bert_config.json"
    max_length = json.loads(settings.read_text()).get("max_seq_length") if settings.is_file() else None
    order = np.argsort([len(text) for text in texts], kind="stable")
    out = np.empty((len(texts), model.config.hidden_size), dtype=np.float32)
    bar = progress(total=len(texts), desc="embed", unit="row")
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            batch = tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                              max_length=max_length or min(tokenizer.model_max_length, 512), return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            out[rows] = _pool(hidden, batch["attention_mask"], mode).float().numpy()
            bar.update(len(rows))
    bar.close()
    return out


def _pool(hidden, attention_mask, mode: str):
    """sentence-transformers' Pooling: the masked mean, the first token, or the masked max."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(mask == 0, -1e9).max(dim=1).values
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
