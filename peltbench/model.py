"""Loading the pretrained BERT and its tokenizer, from the Hub or from a local directory."""

from __future__ import annotations

import copy
import os
from functools import lru_cache
from pathlib import Path

import torch

from . import UserError


def is_local(name: str) -> bool:
    return os.path.isdir(os.path.expanduser(name)) or name.startswith(("/", ".", "~"))


def _check_local(name: str) -> None:
    path = Path(name).expanduser()
    if not path.is_dir():
        raise UserError(f"model.name={name}: no such directory")
    config = path / "config.json"
    if not config.is_file():
        raise UserError(f"model.name={name} is not a BERT checkpoint: no config.json in {path}")


def _load_error(name: str, error: Exception) -> UserError:
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    hint = "" if is_local(name) else " Offline? Point model.name at a local BERT checkpoint directory."
    return UserError(f"could not load model {name!r}: {first_line}.{hint}")


def load_config(name: str, num_labels: int):
    """The model's config, checked to be BERT (the methods wrap `BertForSequenceClassification`'s modules)."""
    from transformers import AutoConfig

    if is_local(name):
        _check_local(name)
    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(name), num_labels=num_labels)
    except Exception as error:
        raise _load_error(name, error) from error
    if config.model_type != "bert":
        raise UserError(f"model.name={name} is not a BERT checkpoint: its config says model_type {config.model_type!r}")
    return config


def load_backbone(name: str, num_labels: int, model_seed: int):
    """A fresh `BertForSequenceClassification` with pretrained weights and a head drawn after seeding.

    Loaded from disk (or the Hub) once per process and copied for each run, so the runs of a sweep in one
    process — Hydra's local launcher, or a packed SLURM job — share one model load. A copy equals a fresh
    load: the same checkpoint, and the head drawn under the same seed.
    """
    return copy.deepcopy(_pretrained(name, num_labels, model_seed))


@lru_cache(maxsize=3)
def _pretrained(name: str, num_labels: int, model_seed: int):
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    config = load_config(name, num_labels)
    hf_logging.set_verbosity_error()  # the "newly initialised classifier" notice is expected here
    torch.manual_seed(model_seed)
    try:
        return BertForSequenceClassification.from_pretrained(
            os.path.expanduser(name), config=config, dtype=torch.float32,
            ignore_mismatched_sizes=True,  # a checkpoint saved with another head size gets a new head
        )
    except Exception as error:
        raise _load_error(name, error) from error


@lru_cache(maxsize=2)
def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(name))
    except Exception as error:
        raise _load_error(name, error) from error


def initial_head(name: str, num_labels: int, model_seed: int):
    """The classifier a run with this model seed starts from: the head transformers drew under the seed at load."""
    return _pretrained(name, num_labels, model_seed).classifier
