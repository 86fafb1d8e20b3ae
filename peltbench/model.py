"""Loading the pretrained encoder and its tokenizer, from the Hub or from a local directory.

Supported: the model types of peltbench/methods/architectures.py (BERT, RoBERTa, DeBERTa-v2/v3, ELECTRA,
ModernBERT); any other checkpoint is refused in one line, from its config.json, before any weights load.

A local directory is checked before anything loads: it must exist, hold a config.json and tokenizer files, and its
tokenizer must fit the model's embedding. Without those checks transformers builds a stand-in tokenizer of a few
special tokens, every word becomes [UNK], and the run ends `ok` with a meaningless score.
"""

from __future__ import annotations

import copy
import os
from functools import lru_cache
from pathlib import Path

from . import UserError
from .architectures import NAMES, SUPPORTED
from .hub import use_hub
from .progress import bars_shown

# A tokenizer is saved as tokenizer.json (fast), or in its slow files: vocab.txt (BERT/ELECTRA WordPiece),
# vocab.json + merges.txt (RoBERTa BPE), spm.model (DeBERTa-v3 SentencePiece). One of them is enough to load it.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spm.model")
# An embedding may have a few rows more than the vocabulary (padded to a multiple of 8 ... 128 for fast kernels).
MAX_EMBEDDING_PADDING = 128


def is_local(name: str) -> bool:
    return os.path.isdir(os.path.expanduser(name)) or name.startswith(("/", ".", "~"))


def _check_local(name: str) -> None:
    path = Path(name).expanduser()
    if not path.is_dir():
        raise UserError(f"model.name={name}: no such directory")
    config = path / "config.json"
    if not config.is_file():
        raise UserError(f"model.name={name} is not a checkpoint: no config.json in {path}")


def _check_tokenizer_files(name: str) -> None:
    path = Path(name).expanduser()
    if not any((path / file).is_file() for file in TOKENIZER_FILES):
        raise UserError(f"model.name={name}: no tokenizer in {path} (no {', '.join(TOKENIZER_FILES[:-1])} or "
                        f"{TOKENIZER_FILES[-1]}); "
                        f"save the checkpoint's tokenizer there (tokenizer.save_pretrained)")


def _check_vocabulary(name: str, tokens: int, vocab_size: int) -> None:
    """The tokenizer's ids index the embedding: more tokens than rows fail mid-run, far fewer mean another vocabulary."""
    if not 0 <= vocab_size - tokens < min(MAX_EMBEDDING_PADDING, max(1, vocab_size // 8)):
        raise UserError(f"model.name={name}: its tokenizer has {tokens} tokens but the model's embedding has "
                        f"{vocab_size} rows (config.json vocab_size): the tokenizer does not belong to this model")


def _load_error(name: str, error: Exception) -> UserError:
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
    hint = "" if is_local(name) else " Offline? Point model.name at a local checkpoint directory (README: Offline use)."
    return UserError(f"could not load model {name!r}: {first_line}.{hint}")


def load_config(name: str, num_labels: int | None = None):
    """The model's config, checked to be of a supported architecture (the methods know where to attach in it)."""
    from transformers import AutoConfig

    if is_local(name):
        _check_local(name)
    else:
        use_hub()  # fails fast without a network (peltbench/hub.py)
    labels = {} if num_labels is None else {"num_labels": num_labels}
    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(name), **labels)
    except Exception as error:
        raise _load_error(name, error) from error
    check_architecture(name, config)
    return config


def check_architecture(name: str, config) -> None:
    """A UserError in one line for a checkpoint peltbench cannot attach its methods to."""
    if config.model_type not in SUPPORTED:
        raise UserError(f"model.name={name}: its config says model_type {config.model_type!r}; peltbench supports "
                        f"{', '.join(f'{t} ({NAMES[t]})' for t in SUPPORTED)}")
    if config.model_type == "deberta-v2" and getattr(config, "conv_kernel_size", 0) > 0:
        raise UserError(f"model.name={name}: a DeBERTa-v2 with a convolution layer (conv_kernel_size, as in "
                        f"deberta-v2-xlarge) is not supported; DeBERTa-v3 has none")


def load_backbone(name: str, num_labels: int, model_seed: int):
    """A fresh `*ForSequenceClassification` with pretrained weights and a head drawn after seeding.

    Loaded from disk (or the Hub) once per process and copied for each run, so the runs of a sweep in one
    process — Hydra's local launcher, or a packed SLURM job — share one model load. A copy equals a fresh
    load: the same checkpoint, and the head drawn under the same seed.
    """
    return copy.deepcopy(_pretrained(name, num_labels, model_seed))


@lru_cache(maxsize=3)
def _pretrained(name: str, num_labels: int, model_seed: int):
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    config = load_config(name, num_labels)
    hf_logging.set_verbosity_error()  # the "newly initialised classifier" notice is expected here
    if not bars_shown():  # its "Loading weights" bar, as ours: none in a log file
        hf_logging.disable_progress_bar()
    torch.manual_seed(model_seed)
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            os.path.expanduser(name), config=config, dtype=torch.float32,
            ignore_mismatched_sizes=True,  # a checkpoint saved with another head size gets a new head
        )
    except Exception as error:
        raise _load_error(name, error) from error


def load_masked_lm(name: str):
    """A fresh `*ForMaskedLM` with the pretrained weights, its masked-LM head included (objective=cloze: nothing is
    drawn), loaded once per process and copied for each group, as `load_backbone`. A checkpoint whose weights lack
    the head is refused in one line (before torch for a local folder: cloze.check_architecture)."""
    return copy.deepcopy(_pretrained_masked_lm(name))


@lru_cache(maxsize=2)
def _pretrained_masked_lm(name: str):
    import torch
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    from .cloze import check_architecture as check_cloze, missing_head, no_head

    config = load_config(name)
    check_cloze(name, config.to_dict())
    hf_logging.set_verbosity_error()  # a missing head is said below, in one line
    if not bars_shown():
        hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(os.path.expanduser(name), config=config,
                                                           dtype=torch.float32, output_loading_info=True)
    except Exception as error:
        raise _load_error(name, error) from error
    missing = missing_head(config.model_type, set(model.state_dict()) - set(info.get("missing_keys", ())))
    if missing:
        raise UserError(no_head(name, config.model_type, missing))
    return model


@lru_cache(maxsize=2)
def load_tokenizer(name: str):
    """The model's tokenizer, refused where it cannot be the model's own (see the module's docstring)."""
    from transformers import AutoTokenizer

    vocab_size = load_config(name).vocab_size  # a local directory without config.json is named as such first
    if is_local(name):
        _check_tokenizer_files(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(name))
    except Exception as error:
        raise _load_error(name, error) from error
    _check_vocabulary(name, len(tokenizer), vocab_size)
    return tokenizer


def initial_head(name: str, num_labels: int, model_seed: int):
    """The model whose new head layers a run with this model seed starts from: the head transformers drew under the
    seed at load (PeltModel reads the layers through the architecture map)."""
    return _pretrained(name, num_labels, model_seed)
