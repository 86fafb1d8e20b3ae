"""A sentence encoder's embeddings, as sentence-transformers computes them, without the package: the demonstration
filter's (peltbench/demonstrations.py, LM-BFF's SBERT filter, `objective.demo_filter`). The encoder is a checkpoint
folder (the installed all-MiniLM-L6-v2 serves offline); its pooling is read as the classifier's `pooling: auto` reads
it (peltbench.objectives.sentence_modes)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import UserError
from .architectures import pooled
from .objectives import pooling_kind, sentence_modes
from .progress import progress


def row_text(texts: Sequence[str]) -> str:
    """What the filter embeds of a row: its sentence, or its two joined by a space (LM-BFF's
    tools/get_sbert_embedding.py, e.g. RTE's `line[1] + ' ' + line[2]`)."""
    return " ".join(texts)


def sentence_pooling(folder: Path) -> str:
    """How a sentence encoder's folder pools its tokens (`first`, `mean` or `max`), as sentence-transformers reads it
    (objectives.sentence_modes: its modules.json's Pooling module), or the mean where it names none (sentence-
    transformers' own default for a plain checkpoint: LM-BFF's `*-nli-stsb-mean-tokens` encoders pool by it)."""
    given = f"objective.demo_filter={folder}"
    found = sentence_modes(str(folder), key="objective.demo_filter")
    if found is None:
        return "mean"
    modes, where = found
    kind = pooling_kind(modes)
    if kind is None:
        raise UserError(f"{given}: its {where} pools by {' and '.join(modes) or 'no pooling mode'}; the filter pools "
                        f"as sentence-transformers does by one of cls_token, mean_tokens, max_tokens alone")
    return kind


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
            out[rows] = pooled(mode, model(**batch), batch["attention_mask"]).float().numpy()  # as the classifier pools
            bar.update(len(rows))
    bar.close()
    return out
