"""Tiny random encoders of every supported architecture (hidden 32, 2 layers, O(1) weights), each with a word-level
tokenizer of its own kind saved beside it: what the tests and `peltbench-check-method` build their models with.

Each is shaped like its real checkpoints: DeBERTa-v3's relative attention (shared keys, log buckets, the relative
embeddings' LayerNorm, no token types, no absolute positions), ModernBERT's alternating global and sliding-window
(here 4 tokens) attention and mean pooling. Built offline in well under a second.
"""

from __future__ import annotations

from pathlib import Path

WORDS = ("the a cat dog sat ran on mat log big small red blue good bad not very happy sad movie film "
         "is was it this that and or but with man woman car house tree runs sleeps").split()
TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=128, type_vocab_size=2)

# The configs of each architecture (module docstring), beside TINY's shared sizes.
ENCODERS = {
    "bert": {},
    "roberta": {"type_vocab_size": 1},
    "electra": {"embedding_size": 16},  # ELECTRA-small's embeddings project up to hidden
    "deberta-v2": {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_buckets": 16,
                   "max_relative_positions": -1, "share_att_key": True, "norm_rel_ebd": "layer_norm",
                   "type_vocab_size": 0, "position_biased_input": False},
    "modernbert": {"global_attn_every_n_layers": 2, "local_attention": 4, "classifier_pooling": "mean"},
}
# O(1) weights for the encoder tests: N(0, 0.2²) makes attention scores O(1) at hidden 32 (attention probabilities up to
# 0.3-0.9 instead of the uniform 1/17 of transformers' default 0.02, logits O(1) instead of O(0.01)). With the default,
# a whole missing code path (DeBERTa's relative bias: 4e-7 on the logits) hides inside the tests' tolerances.
O1_INIT = 0.2
# RoBERTa and ModernBERT tokenizers use <s> </s> (a pair: <s> A </s></s> B </s>) and return no token type ids.
ROBERTA_STYLE = ("roberta", "modernbert")


def tiny_tokenizer(model_type: str, folder: Path | None = None):
    """A word-level tokenizer with the architecture's own special tokens and pair template, saved to `folder`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    roberta = model_type in ROBERTA_STYLE
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] if roberta else ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    cls, pad, sep, unk, mask = (specials[0], specials[1], specials[2], specials[3], specials[4]) if roberta else \
        (specials[2], specials[0], specials[3], specials[1], specials[4])
    tokens = specials + list(WORDS)
    vocab = {token: i for i, token in enumerate(tokens + [f"[unused{i}]" for i in range(TINY["vocab_size"] - len(tokens))])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if roberta:
        tokenizer.post_processor = processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]))
        names = ["input_ids", "attention_mask"]
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
        names = ["input_ids", "token_type_ids", "attention_mask"]
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, cls_token=cls, sep_token=sep, pad_token=pad, unk_token=unk,
                                   mask_token=mask, model_input_names=names)
    if folder is not None:
        fast.save_pretrained(folder)
    return fast


def tiny_encoder_config(model_type: str, num_labels: int = 2, dropout: float = 0.1, **changes):
    from transformers import AutoConfig

    tokenizer = tiny_tokenizer(model_type)
    special = {"pad_token_id": tokenizer.pad_token_id}
    if model_type == "modernbert":
        special.update(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                       cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                       embedding_dropout=dropout, attention_dropout=dropout, mlp_dropout=dropout, classifier_dropout=dropout)
    else:
        special.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    settings = {key: value for key, value in TINY.items() if not (model_type == "modernbert" and key == "type_vocab_size")}
    settings["initializer_range"] = O1_INIT
    settings.update(ENCODERS[model_type])
    settings.update(special)
    settings.update(changes)
    return AutoConfig.for_model(model_type, num_labels=num_labels, **settings)


def tiny_encoder(model_type: str, num_labels: int = 2, seed: int = 0, dropout: float = 0.1, **changes):
    """A tiny random `*ForSequenceClassification` of an architecture, in eval mode."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = tiny_encoder_config(model_type, num_labels, dropout, **changes)
    return AutoModelForSequenceClassification.from_config(config).eval()


def tiny_masked_lm(model_type: str, seed: int = 0, dropout: float = 0.1, **changes):
    """A tiny random `*ForMaskedLM` of an architecture (its masked-LM head: objective=cloze), in eval mode."""
    import torch
    from transformers import AutoModelForMaskedLM

    from .architectures import architecture, get

    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(tiny_encoder_config(model_type, 2, dropout, **changes)).eval()
    mlm = architecture(model_type).masked_lm
    with torch.no_grad():  # transformers starts the vocabulary bias at 0, which would hide a head that drops it
        bias = get(model, mlm.bias) if mlm.bias else get(model, mlm.decoder).bias
        bias.normal_(0.0, O1_INIT)
    return model


def save_tiny_encoder(model_type: str, folder: Path, dropout: float = 0.1, masked_lm: bool = False, **changes) -> Path:
    """A local checkpoint directory of a tiny random encoder with its tokenizer saved beside, as a user's would be;
    with `masked_lm`, saved with its masked-LM head (a pretrained checkpoint's form: objective=cloze reads it)."""
    tiny_tokenizer(model_type, folder)
    build = tiny_masked_lm if masked_lm else tiny_encoder
    build(model_type, dropout=dropout, **changes).save_pretrained(folder)
    return folder


# A small task any method can learn in a few steps (peltbench-check-method): SST-2's files, each sentence's words all
# drawn from one half of the vocabulary, which its label names.
POSITIVE = ("good", "happy", "big", "red", "cat", "man", "house", "runs", "very", "movie", "is", "it", "the")
NEGATIVE = ("bad", "sad", "small", "blue", "dog", "woman", "car", "sleeps", "not", "film", "was", "this", "a")


def write_sentiment_task(root: Path, train_rows: int = 64, test_rows: int = 32, seed: int = 0) -> Path:
    """`root/SST-2/{train,dev}.tsv` in GLUE's layout (a header, sentence TAB label), half of each split positive: 3-8
    words of POSITIVE or of NEGATIVE. Returns `root`, a `data.dir`."""
    import random

    rng = random.Random(seed)
    folder = root / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.tsv", train_rows), ("dev.tsv", test_rows)):
        lines = ["sentence\tlabel"]
        for row in range(rows):
            label = row % 2
            words = [rng.choice(POSITIVE if label else NEGATIVE) for _ in range(rng.randint(3, 8))]
            lines.append(f"{' '.join(words)}\t{label}")
        (folder / name).write_text("\n".join(lines) + "\n")
    return root
