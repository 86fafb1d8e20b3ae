"""objective=cloze, LM-BFF's prompt-based fine-tuning (Gao et al., ACL 2021): a run's prompt, resolved and checked.

A run's prompt is its objective node's `template`, `label_words` and sentence limits; the objective file takes each
from the task file's `cloze:` block unless given (conf/objective/cloze.yaml), so the 8 GLUE tasks run LM-BFF's manual
prompts and a task file of one's own names its own. Everything here is checked before torch loads (config.py) where
it can be: the template (exactly one *mask*, only sentences the task has: peltbench/templates.py), the label words'
classes, the architecture, and for a local checkpoint whether its weights hold a masked-LM head (read from the
safetensors header, the shards' index, or the pickle's strings: no torch). A label word's being one token needs the
tokenizer: checked when the run tokenises its rows, before any model is built (data.encode).
"""

from __future__ import annotations

import json
import pickletools
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import UserError
from .architectures import ARCHITECTURES, CLOZE_REFUSED, DISCRIMINATOR, NAMES
from .templates import TemplateError, check_template, label_word_ids

CLOZE = "cloze"


@dataclass(frozen=True)
class Prompt:
    """A run's cloze prompt: LM-BFF's template and label words (class key → word: the task's label names, or its
    class ids as text; a regression task's "0" and "1", its low and high poles) and its tokenisation options."""

    template: str
    label_words: tuple[tuple[str, str], ...]
    first_sent_limit: int | None = None
    other_sent_limit: int | None = None
    truncate_head: bool = False

    def words(self) -> dict[str, str]:
        return dict(self.label_words)


def is_cloze(cfg) -> bool:
    objective = cfg.get("objective") if hasattr(cfg, "get") else None
    return objective is not None and objective.get("name") == CLOZE


def class_keys(task) -> list[str]:
    """The keys label words are given by, in the order of the classes' ids: the task's label names, or its ids; a
    regression task's two poles "0" (low) and "1" (high), as LM-BFF's STS-B mapping has them."""
    if task.is_regression:
        return ["0", "1"]
    return list(task.label_names) if task.label_names else [str(i) for i in range(task.num_labels)]


def prompt_of(cfg, task) -> Prompt:
    """The run's prompt: each setting of its objective node, or where that is null the task file's `cloze:` value."""
    given = cfg.task.get("cloze") or {}
    node = {key: given.get(key) if cfg.objective.get(key) is None else cfg.objective.get(key)
            for key in ("template", "label_words", "first_sent_limit", "other_sent_limit")}
    node["truncate_head"] = cfg.objective.get("truncate_head", False)
    where = f"objective=cloze on task {task.name}"
    if node.get("template") is None:
        raise UserError(f"{where}: no template: the task file names none (task.cloze.template) and "
                        f"objective.template is not set (e.g. objective.template='*cls**sent_0*_It_was*mask*.*sep+*')")
    if node.get("label_words") is None:
        raise UserError(f"{where}: no label words: the task file names none (task.cloze.label_words) and "
                        f"objective.label_words is not set (e.g. 'objective.label_words={{0: terrible, 1: great}}')")
    words = node["label_words"]
    if not isinstance(words, Mapping) and not hasattr(words, "items"):
        raise UserError(f"{where}: label_words must map each class to a word, e.g. {{0: terrible, 1: great}}, not "
                        f"{words!r}")
    pairs = tuple((str(key), _word(word)) for key, word in words.items())
    return Prompt(str(node["template"]), pairs, _limit(node, "first_sent_limit", where),
                  _limit(node, "other_sent_limit", where), bool(node.get("truncate_head", False)))


def _word(word) -> str:
    return ("Yes" if word else "No") if isinstance(word, bool) else str(word)  # YAML 1.1's unquoted Yes / No


def _limit(node, key: str, where: str) -> int | None:
    value = node.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where}: {key} must be a positive number of tokens or null, not {value!r}")
    return int(value)


def check_prompt(prompt: Prompt, task) -> None:
    """The template's rules and the label words' classes (no tokenizer needed): one line each."""
    where = f"objective=cloze on task {task.name}"
    if task.is_regression and task.label_range is None:
        raise UserError(f"{where}: a regression task needs label_range (LM-BFF interpolates the score between its two "
                        f"poles' label words)")
    try:
        check_template(prompt.template, sentences=len(task.text), where=f"{where}: the template")
    except TemplateError as error:
        raise UserError(str(error)) from None
    keys, given = class_keys(task), [key for key, _ in prompt.label_words]
    missing = [key for key in keys if key not in given]
    extra = [key for key in given if key not in keys]
    if missing or extra:
        what = f"no word for class {missing[0]!r}" if missing else f"{extra[0]!r} is not a class"
        poles = " (a regression task's: 0 its low pole, 1 its high)" if task.is_regression else ""
        raise UserError(f"{where}: label words {prompt.words()}: {what}; the classes are {', '.join(keys)}{poles}")


def prompt_label_ids(prompt: Prompt, task, tokenizer) -> tuple[int, ...]:
    """The label words' token ids in class order, by LM-BFF's rule (templates.label_word_id)."""
    try:
        return tuple(label_word_ids(prompt.words(), tokenizer, class_keys(task)))
    except TemplateError as error:
        raise UserError(f"objective=cloze on task {task.name}: {error}") from None


def check_architecture(name: str, model_config: dict | None) -> None:
    """An architecture whose checkpoints can have a masked-LM head, and, for a local checkpoint, its weights holding
    one (before torch: config.py). A Hub model's weights are checked when they load (model.load_masked_lm)."""
    if not model_config:
        return
    model_type = model_config.get("model_type")
    if model_type in CLOZE_REFUSED:
        raise UserError(f"model.name={name}: objective=cloze needs a masked-LM head: {CLOZE_REFUSED[model_type]}")
    if model_type not in ARCHITECTURES:
        return  # model.check_architecture refuses it, naming what is supported
    keys = checkpoint_keys(Path(name).expanduser()) if Path(name).expanduser().is_dir() else cached_keys(name)
    if keys is not None:
        missing = missing_head(model_type, keys)
        if missing:
            raise UserError(no_head(name, model_type, missing))


def missing_head(model_type: str, keys) -> str | None:
    """The first of the masked-LM head's weights that `keys` (a checkpoint's tensor names) lack, or None."""
    for weight in ARCHITECTURES[model_type].masked_lm.weights:
        if not any(key == weight or key.endswith("." + weight) for key in keys):
            return weight
    return None


def no_head(name: str, model_type: str, missing: str) -> str:
    why = f"ELECTRA's released discriminators are {DISCRIMINATOR}; its generators have one" \
        if model_type == "electra" else "a sentence-transformers encoder, or a model saved without its pretraining head"
    return (f"model.name={name}: objective=cloze scores label words with the checkpoint's masked-LM head, and this "
            f"{NAMES[model_type]} checkpoint has none (no {missing} in its weights: {why}); use one saved with it "
            f"(e.g. bert-base-uncased, roberta-large)")


def checkpoint_keys(folder: Path) -> set[str] | None:
    """The tensor names of a local checkpoint's weights, read without torch; None where they cannot be (not a local
    folder, or a format not read here)."""
    if not folder.is_dir():
        return None
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            try:
                return set(json.loads((folder / index).read_text())["weight_map"])
            except (OSError, ValueError, KeyError):
                return None
    if (folder / "model.safetensors").is_file():
        return _safetensors_keys(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return _pickle_strings(folder / "pytorch_model.bin")
    return None


def cached_keys(name: str) -> set[str] | None:
    """The tensor names of Hub model `name` where the Hugging Face cache holds its safetensors weights (or their
    index); None where it does not (its weights are checked when they load)."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        for file in ("model.safetensors.index.json", "model.safetensors"):
            found = try_to_load_from_cache(name, file)
            if isinstance(found, str):
                return checkpoint_keys(Path(found).parent)
    except Exception:  # an id the cache cannot hold, an unreadable cache: checked when the weights load
        return None
    return None


def _safetensors_keys(path: Path) -> set[str] | None:
    try:
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            return set(json.loads(handle.read(size))) - {"__metadata__"}
    except (OSError, ValueError):
        return None


def _pickle_strings(path: Path) -> set[str] | None:
    """The strings of a torch zip checkpoint's pickle (its state dict's keys among them), by reading its opcodes."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            if name is None:
                return None
            data = archive.read(name)
        return {arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str)}
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
