"""LM-BFF's template language and its tokenisation (Gao et al., ACL 2021), ported from its released code.

The source: princeton-nlp/LM-BFF at commit c282f521001f9c299d29eec7b459266f2b14fbaf, `src/dataset.py`
(`tokenize_multipart_input`, its `prompt=True` branch) and the label-word rule of `FewShotDataset.__init__`.
tests/test_templates.py holds this port to fixtures computed by running their function (tests/data/lmbff_templates/).

A template is text with variables between stars, e.g. SST-2's `*cls**sent_0*_It_was*mask*.*sep+*`; `_` is a space.
As in LM-BFF, `template.split('*')` gives the parts and each part is read by its content alone:

    *cls* *mask* *sep*       the tokenizer's [CLS] / [MASK] / [SEP] (RoBERTa: <s> <mask> </s>)
    *sep+*                   [SEP], and every later token gets the next segment id
    *sent_i*                 sentence i of the row (0: the first text column, 1: the second; demonstrations: 2, 3, ...)
    *+sent_i*                the same with a space in front (RoBERTa's BPE then gives the word its Ġ form)
    *sent-_i*                the sentence without its last character (its final punctuation)
    *sentl_i* *+sentl_i*     the sentence with its first character lower-cased (and a space in front)
    *sentl-_i*               lower-cased first character, last character dropped
    *sentu_i* *+sentu_i*     upper-cased first character (and a space in front)
    *label_i*                the label word of class i (a token id: `label_word_ids`)
    *labelx_i*               the label word of the class of demonstration i (`support_labels[i]`)
    anything else            text: `_` becomes a space; a single character is looked up in the vocabulary as it is
                             (`.` → the token `.`), longer text is tokenised without special tokens

Sentence parts are cut to their first `first_sent_limit` (sentence 0) or `other_sent_limit` (the others) tokens; the
whole sequence is then cut to `max_length` at the tail, or at the head with `truncate_head`. The mask position is
the first [MASK] in the cut sequence (LM-BFF: `input_ids.index(mask_token_id)`); where the cut removed it LM-BFF
stops with an error, and `Tokenized.mask_pos` is None (the caller refuses the row in one line).

Segment ids: LM-BFF computes them (`*sep+*`) but returns them only when `'BERT' in type(tokenizer).__name__`, which
no BERT tokenizer class name satisfies (`BertTokenizer`, `BertTokenizerFast`): every token reaches its model as
segment 0. `Tokenized.segment_ids` keeps what it computed; a model input uses zeros, as LM-BFF's did.

Public functions (signatures stable; tests/test_templates.py):

    parse_template(template) -> tuple[str, ...]
        LM-BFF's parts, each checked (TemplateError, one line, for a variable whose index is not an integer, or a
        text part LM-BFF's sentence-limit check would fail on).
    check_template(template, sentences=None, where="template") -> None
        the cloze objective's rules: exactly one *mask*, and (with `sentences`) no *sent..._i* with i ≥ sentences.
    sentence_ids(template) -> set[int];  label_ids(template) -> set[int]
    label_word_id(word, tokenizer, where="label word") -> int
        LM-BFF's rule: a word not starting with < [ . , is tokenised with a space in front (' great': RoBERTa's
        `Ġgreat`, BERT's `great`) and must be exactly one token; one that starts with one of them is looked up as is.
        Beyond LM-BFF (which would score the unknown token): a word the tokenizer knows only as its unknown token is
        refused.
    label_word_ids(label_words, tokenizer, classes) -> list[int]
        the ids of `label_words[c]` for each class key c in `classes`, in that order.
    tokenize_multipart_input(input_text_list, max_length, tokenizer, template, label_word_list=None,
                             first_sent_limit=None, other_sent_limit=None, truncate_head=False,
                             support_labels=None) -> Tokenized
        the port: `Tokenized(input_ids, segment_ids, mask_pos)`, not padded; `Tokenized.padded(max_length, pad_id)`
        gives LM-BFF's padded {'input_ids', 'attention_mask', 'mask_pos'}.

Only the tokenizer's `encode`, `tokenize`, `convert_tokens_to_ids` and special-token ids are used (no torch).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SPECIAL = ("cls", "mask", "sep", "sep+")
# The sentence variables, in the order LM-BFF's code tests them (each by its prefix): prefix → (space in front,
# first character lower/upper-cased, last character dropped)
SENTENCE_FORMS = {
    "sent_": ("", None, False),
    "+sent_": (" ", None, False),
    "sent-_": ("", None, True),
    "sentl_": ("", "lower", False),
    "+sentl_": (" ", "lower", False),
    "sentl-_": ("", "lower", True),
    "sentu_": ("", "upper", False),
    "+sentu_": (" ", "upper", False),
}
LABEL_FORMS = ("label_", "labelx_")
# Label words starting with one of these are looked up as they are, not with a space in front (LM-BFF's rule)
AS_IS = ("<", "[", ".", ",")


class TemplateError(ValueError):
    """A template or label word LM-BFF's code would fail on or the cloze objective cannot use: one line."""


@dataclass(frozen=True)
class Tokenized:
    """One row built from a template: token ids (cut to max_length, not padded), LM-BFF's segment ids (computed, never
    passed to its model: module docstring), and the mask's position (None where the cut removed it)."""

    input_ids: list[int]
    segment_ids: list[int]
    mask_pos: int | None

    def padded(self, max_length: int, pad_id: int) -> dict[str, list[int]]:
        """LM-BFF's own output for this row: padded to max_length (`mask_pos` as its one-element list)."""
        pad = max_length - len(self.input_ids)
        return {"input_ids": self.input_ids + [pad_id] * pad, "attention_mask": [1] * len(self.input_ids) + [0] * pad,
                "mask_pos": [self.mask_pos]}


def _kind(part: str) -> tuple[str, str | None]:
    """(what a part is, its variable prefix): LM-BFF's dispatch order, by content."""
    if part in SPECIAL:
        return "special", None
    for prefix in LABEL_FORMS:
        if part.startswith(prefix):
            return "label", prefix
    for prefix in SENTENCE_FORMS:
        if part.startswith(prefix):
            return "sentence", prefix
    return "text", None


def _index(part: str, where: str) -> int:
    """The i of `sent_i` / `label_i` (LM-BFF: `int(part.split('_')[1])`)."""
    try:
        return int(part.split("_")[1])
    except (IndexError, ValueError):
        raise TemplateError(f"{where}: *{part}* names no sentence or class index (write e.g. *sent_0*, "
                            f"*label_1*)") from None


def parse_template(template: str, where: str = "template") -> tuple[str, ...]:
    """LM-BFF's parts of a template (`template.split('*')`), each checked as its code would read it."""
    if not isinstance(template, str) or not template:
        raise TemplateError(f"{where}: must be a non-empty string in LM-BFF's template language, e.g. "
                            f"'*cls**sent_0*_It_was*mask*.*sep+*'")
    parts = tuple(template.split("*"))
    for part in parts:
        kind, _ = _kind(part)
        if kind in ("label", "sentence"):
            _index(part, where)
        elif kind == "text":
            text = part.replace("_", " ")
            # LM-BFF applies the sentence limit to any part whose text starts with `sent` (at 0 or 1) and then
            # reads its index after a `_`, which text no longer has: its code stops there.
            if text[:4] == "sent" or text[1:5] == "sent":
                raise TemplateError(f"{where}: the text {part!r} begins like a sentence variable, which LM-BFF's "
                                    f"code cannot tokenise (write the word differently, or put it in *...* as a "
                                    f"variable)")
    return parts


def sentence_ids(template: str) -> set[int]:
    return {_index(part, "template") for part in parse_template(template) if _kind(part)[0] == "sentence"}


def label_ids(template: str) -> set[int]:
    """The classes (`*label_i*`) and demonstrations (`*labelx_i*`) whose label word the template names."""
    return {_index(part, "template") for part in parse_template(template) if _kind(part)[0] == "label"}


def check_template(template: str, sentences: int | None = None, where: str = "template") -> None:
    """What the cloze objective needs of a template beyond LM-BFF's language: exactly one *mask*, and (given the
    number of the row's sentences) only sentences the row has."""
    parts = parse_template(template, where)
    masks = sum(part == "mask" for part in parts)
    if masks != 1:
        raise TemplateError(f"{where} {template!r} has {masks} *mask*: the cloze objective needs exactly one (the "
                            f"position whose label word it scores)")
    if sentences is not None:
        beyond = sorted(i for i in sentence_ids(template) if i >= sentences)
        if beyond:
            have = "sentence 0" if sentences == 1 else f"sentences 0 to {sentences - 1}"
            raise TemplateError(f"{where} {template!r} names sentence {beyond[0]} (*sent_{beyond[0]}* or a form of "
                                f"it), but the task's rows have {have}")


def label_word_id(word: str, tokenizer, where: str = "label word") -> int:
    """A label word's token id, by LM-BFF's rule (module docstring)."""
    if not isinstance(word, str) or not word:
        raise TemplateError(f"{where}: must be a non-empty word, not {word!r}")
    if word[0] in AS_IS:
        tokens = [word]
    else:
        tokens = tokenizer.tokenize(" " + word)
        if len(tokens) != 1:
            raise TemplateError(f"{where} {word!r} is {len(tokens)} tokens of this model's vocabulary "
                                f"({' '.join(tokens)}), not one: LM-BFF scores one token at the mask (tokenised with "
                                f"a space in front, as RoBERTa's Ġ{word}); choose a word that is one token")
    token_id = tokenizer.convert_tokens_to_ids(tokens[0])
    if token_id == tokenizer.unk_token_id and word != tokenizer.unk_token:  # LM-BFF would score the unknown token
        raise TemplateError(f"{where} {word!r} is not a token of this model's vocabulary (its tokenizer gives "
                            f"{tokenizer.unk_token}; a word starting with {' '.join(AS_IS)} is looked up as it is)")
    return int(token_id)


def label_word_ids(label_words: Mapping, tokenizer, classes: Sequence[str]) -> list[int]:
    """The label words' ids in the order of `classes` (the keys label_words is read with: class names or ids)."""
    by_key = {str(key): word for key, word in label_words.items()}
    missing = [key for key in classes if str(key) not in by_key]
    if missing:
        raise TemplateError(f"label words {dict(by_key)}: no word for class {missing[0]!r} (the classes: "
                            f"{', '.join(map(str, classes))})")
    extra = sorted(set(by_key) - {str(key) for key in classes})
    if extra:
        raise TemplateError(f"label words {dict(by_key)}: {extra[0]!r} is not a class (the classes: "
                            f"{', '.join(map(str, classes))})")
    return [label_word_id(by_key[str(key)], tokenizer, f"label word of class {key}") for key in classes]


def _sentence_tokens(part: str, prefix: str, texts: Sequence[str], enc) -> list[int]:
    space, case, drop_last = SENTENCE_FORMS[prefix]
    text = texts[_index(part, "template")]
    if case == "lower":
        text = text[:1].lower() + text[1:]
    elif case == "upper":
        text = text[:1].upper() + text[1:]
    if drop_last:
        text = text[:-1]
    return enc(space + text)


def tokenize_multipart_input(input_text_list: Sequence[str], max_length: int, tokenizer, template: str,
                             label_word_list: Sequence[int] | None = None, first_sent_limit: int | None = None,
                             other_sent_limit: int | None = None, truncate_head: bool = False,
                             support_labels: Sequence[int] | None = None) -> Tokenized:
    """LM-BFF's `tokenize_multipart_input(..., prompt=True, ...)` (module docstring), without its padding."""
    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    special = {"cls": tokenizer.cls_token_id, "mask": tokenizer.mask_token_id, "sep": tokenizer.sep_token_id,
               "sep+": tokenizer.sep_token_id}
    input_ids: list[int] = []
    segment_ids: list[int] = []
    segment = 0
    for part in parse_template(template):
        kind, prefix = _kind(part)
        if kind == "special":
            tokens = [special[part]]
        elif kind == "label":
            label = _index(part, "template") if prefix == "label_" else support_labels[_index(part, "template")]
            tokens = [label_word_list[label]]
        elif kind == "sentence":
            tokens = _sentence_tokens(part, prefix, input_text_list, enc)
            limit = first_sent_limit if _index(part, "template") == 0 else other_sent_limit
            if limit is not None:
                tokens = tokens[:limit]
        else:
            text = part.replace("_", " ")
            tokens = [tokenizer.convert_tokens_to_ids(text)] if len(text) == 1 else enc(text)
        input_ids += tokens
        segment_ids += [segment] * len(tokens)
        if part == "sep+":
            segment += 1
    if len(input_ids) > max_length:
        cut = slice(-max_length, None) if truncate_head else slice(None, max_length)
        input_ids, segment_ids = input_ids[cut], segment_ids[cut]
    mask = tokenizer.mask_token_id
    return Tokenized(input_ids, segment_ids, input_ids.index(mask) if mask in input_ids else None)
