"""Where each PELT method attaches in each encoder family: one small map per architecture, keyed by `model_type`.

The methods are written once, against this map (as PEFT's target-module mapping): where a layer's q/k/v
projections are (ModernBERT fuses them in one `Wqkv`: a projection is then a row block of it), the attention module
(prefixes join its keys and values), the FFN block that adapters attach to (post-norm: BERT's output block with its
LayerNorm; pre-norm: ModernBERT's MLP, whose block has no LayerNorm after it) and the FFN's second Linear ((IA)³
scales its input), and the classification head as the model's own `*ForSequenceClassification` defines it: how it
pools, and which of its layers are new (drawn under the model seed, one per run) rather than pretrained (part of the
frozen backbone). Where an architecture truly differs,
one hook says so: DeBERTa's disentangled relative-position attention is computed by peltbench (methods/attention.py),
so that prefixes and a group's members reach its relative bias too.

`SUPPORTED` is importable without torch (peltbench.model checks a checkpoint's model_type against it before loading).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED = ("bert", "roberta", "deberta-v2", "electra", "modernbert")
NAMES = {"bert": "BERT", "roberta": "RoBERTa", "deberta-v2": "DeBERTa-v2/v3", "electra": "ELECTRA",
         "modernbert": "ModernBERT"}


@dataclass(frozen=True)
class Head:
    """The head `*ForSequenceClassification` puts on the encoder's output (paths from that model).

    pooled = pool(encoder output)                      [pretrained, frozen: part of the backbone]
    logits = out(drop(act(dense(drop(pooled)))))        [new: drawn under the model seed, one per run]
    `dense` is None where the head is one Linear (BERT: its pooler is pretrained; ModernBERT: its `head` is).
    The classifier objective's `pooling` (peltbench.objectives) chooses another pool than the model's own (`pooled`);
    what comes after it stays (`head_input`: ModernBERT's pretrained head; the new layers).
    """

    pool: str                        # its own pooling: "pooler" (BERT's pooler_output), "first" (the first token),
    # "modernbert" (the first token or the mean, as config.classifier_pooling says, then its pretrained `head`)
    out: str                         # the final Linear
    dropout: str                     # the Dropout before `out`
    dense: str | None = None         # a new Linear before `out`
    activation: str | None = None    # after `dense`: an ACT2FN name, or "config:<key>" to read it from the config
    dense_dropout: str | None = None # the Dropout before `dense`


@dataclass(frozen=True)
class MaskedLM:
    """The masked-LM head `*ForMaskedLM` puts on the encoder (paths from that model), which the cloze objective reads:

    scores = decoder(norm(act(dense(h))))              [pretrained; decoder: rows of the word embeddings, tied]
    The transform (dense, act, norm) stays in the backbone, pretrained (trained as the backbone is: by `ft`, its biases
    by BitFit, its norm by LN-tuning); the decoder's label-word rows and biases are the head (methods/base.ClozeHead).
    """

    dense: str
    activation: str                  # an ACT2FN name, or "config:<key>" to read it from the config
    norm: str
    decoder: str                     # the Linear to the vocabulary
    bias: str | None                 # the vocabulary bias as the model holds it apart from the decoder (tied to it)
    weights: tuple[str, ...]         # checkpoint keys without which a checkpoint has no such head (model.py)


_BERT_MLM = MaskedLM(dense="cls.predictions.transform.dense", activation="config:hidden_act",
                     norm="cls.predictions.transform.LayerNorm", decoder="cls.predictions.decoder",
                     bias="cls.predictions.bias", weights=("cls.predictions.transform.dense.weight",))


@dataclass(frozen=True)
class Architecture:
    model_type: str
    layers: str                      # from the encoder (`model.base_model`): the list of layers
    attention: str                   # from a layer: the module that computes q/k/v and attends
    projections: dict[str, tuple[str, int | None]]  # query/key/value → (Linear in `attention`, its row block if fused)
    ffn: str                         # from a layer: post-norm, the FFN output block; pre-norm, the FFN itself
    dense: dict[str, str]            # attention_output / intermediate / output → the Linear's path from a layer
    pre_norm: bool
    head: Head
    glu: bool = False                # the FFN's first Linear (`dense["intermediate"]`) computes a GLU's input and
    # gate: 2 × intermediate_size outputs (ModernBERT's mlp.Wi)
    norms: tuple[str, str] = ("attention.output.LayerNorm", "output.LayerNorm")  # from a layer: the attention
    # block's and the FFN block's LayerNorm (post-norm: after the block; pre-norm: before it)
    embeddings_norm: str = "embeddings.LayerNorm"  # from the encoder
    relative_attention: bool = False  # DeBERTa: peltbench computes the disentangled attention (methods/attention.py)
    token_types: bool = True         # the encoder takes token_type_ids (unless its config has no token types)
    positions: str | None = "absolute"  # what a prefix's position shift (P-tuning v2) moves: absolute position
    # embeddings numbered 0, 1, ... ("absolute"), or from padding_idx + 1 over the non-pad tokens (RoBERTa:
    # "after_padding_idx"); None: no absolute positions (ModernBERT's RoPE, which a uniform shift does not change)
    positions_if: str | None = None  # a config flag without which the model has none (DeBERTa: position_biased_input;
    # DeBERTa-v3 has it false: its relative positions see no uniform shift)
    masked_lm: MaskedLM | None = None  # the masked-LM head (objective=cloze), None where it has none to score with
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return NAMES[self.model_type]

    @property
    def ffn_linear(self) -> str:
        """From the `ffn` block: the FFN's second Linear (`dense["output"]`), whose input is the FFN's inner activation
        ((IA)³ scales it): BERT's `output.dense`; ModernBERT's `mlp.Wo`, whose input is the GLU's output."""
        return self.dense["output"].removeprefix(f"{self.ffn}.")


_BERT_PROJECTIONS = {"query": ("query", None), "key": ("key", None), "value": ("value", None)}
_BERT_DENSE = {"attention_output": "attention.output.dense", "intermediate": "intermediate.dense",
               "output": "output.dense"}
_CLASSIFICATION_HEAD = dict(pool="first", dense="classifier.dense", out="classifier.out_proj",
                            dropout="classifier.dropout", dense_dropout="classifier.dropout")

ARCHITECTURES = {
    "bert": Architecture(
        "bert", layers="encoder.layer", attention="attention.self", projections=_BERT_PROJECTIONS, ffn="output",
        dense=_BERT_DENSE,
        pre_norm=False, head=Head(pool="pooler", out="classifier", dropout="dropout"), masked_lm=_BERT_MLM),
    "roberta": Architecture(
        "roberta", layers="encoder.layer", attention="attention.self", projections=_BERT_PROJECTIONS, ffn="output",
        dense=_BERT_DENSE,
        pre_norm=False, head=Head(activation="tanh", **_CLASSIFICATION_HEAD), positions="after_padding_idx",
        masked_lm=MaskedLM(dense="lm_head.dense", activation="gelu", norm="lm_head.layer_norm",
                           decoder="lm_head.decoder", bias="lm_head.bias", weights=("lm_head.dense.weight",))),
    "electra": Architecture(
        "electra", layers="encoder.layer", attention="attention.self", projections=_BERT_PROJECTIONS, ffn="output",
        dense=_BERT_DENSE,
        pre_norm=False, head=Head(activation="gelu", **_CLASSIFICATION_HEAD),
        # the generator's head: a released discriminator checkpoint has none (CLOZE_REFUSED says what then)
        masked_lm=MaskedLM(dense="generator_predictions.dense", activation="gelu",
                           norm="generator_predictions.LayerNorm", decoder="generator_lm_head", bias=None,
                           weights=("generator_predictions.dense.weight",))),
    "deberta-v2": Architecture(
        "deberta-v2", layers="encoder.layer", attention="attention.self",
        projections={"query": ("query_proj", None), "key": ("key_proj", None), "value": ("value_proj", None)},
        ffn="output", dense=_BERT_DENSE, pre_norm=False, relative_attention=True, positions_if="position_biased_input",
        head=Head(pool="first", dense="pooler.dense", activation="config:pooler_hidden_act", out="classifier",
                  dropout="dropout", dense_dropout="pooler.dropout")),
    "modernbert": Architecture(
        "modernbert", layers="layers", attention="attn",
        projections={"query": ("Wqkv", 0), "key": ("Wqkv", 1), "value": ("Wqkv", 2)},
        ffn="mlp", dense={"attention_output": "attn.Wo", "intermediate": "mlp.Wi", "output": "mlp.Wo"},
        pre_norm=True, glu=True, token_types=False, norms=("attn_norm", "mlp_norm"), embeddings_norm="embeddings.norm",
        head=Head(pool="modernbert", out="classifier", dropout="drop"), positions=None,
        masked_lm=MaskedLM(dense="head.dense", activation="config:classifier_activation", norm="head.norm",
                           decoder="decoder", bias=None, weights=("head.dense.weight", "decoder.bias"))),
}
# Why a checkpoint cannot take objective=cloze where its masked-LM head is missing: ELECTRA's and DeBERTa-v3's released
# checkpoints are replaced-token-detection discriminators. Prompting one (Xia et al. 2022, "Prompting ELECTRA";
# Yao et al. 2022, DPT) puts each class's label word into the input and scores it original vs replaced: C forward
# passes per row and another objective, not built here.
DISCRIMINATOR = ("a replaced-token-detection discriminator without a masked-LM head; prompting it through its "
                 "discriminator head (each label word scored original vs replaced: Xia et al. 2022) is not built")
CLOZE_REFUSED = {"deberta-v2": f"DeBERTa-v3's released checkpoints are {DISCRIMINATOR}"}


def architecture(model_type: str) -> Architecture:
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}") from None


def output_size(arch: Architecture, target: str, config: dict) -> tuple[int | None, str]:
    """(the output size of a layer's `target` Linear, what in the model's config.json gives it), from the config alone
    (a check before torch): q, k, v (each, in a fused Wqkv), the attention output and the FFN's output give
    hidden_size, the FFN's first Linear intermediate_size (twice that for a GLU)."""
    if target != "intermediate":
        return config.get("hidden_size"), f"hidden_size {config.get('hidden_size')}"
    size = config.get("intermediate_size")
    if size is None or not arch.glu:
        return size, f"intermediate_size {size}"
    return 2 * int(size), f"{arch.dense['intermediate']}: 2 × intermediate_size {size}, a GLU's input and gate"


def get(module, path: str):
    """The submodule at a dotted path (`attention.self`), or None where the path does not exist."""
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def put(module, path: str, child) -> None:
    """Replace (or, with None, remove) the submodule at a dotted path."""
    parent_path, _, name = path.rpartition(".")
    parent = get(module, parent_path) if parent_path else module
    if child is None:
        delattr(parent, name)
    else:
        setattr(parent, name, child)


def unwrapped(module):
    """The model's own module under peltbench's wrappers (each keeps what it wraps as `inner`)."""
    while hasattr(module, "inner"):
        module = module.inner
    return module


def head_pooling(arch: Architecture, config) -> str:
    """How the model's own `*ForSequenceClassification` pools (objective.pooling=head, and what peltbench did before
    that setting): BERT's pretrained pooler (`pooler`), ModernBERT's `config.classifier_pooling` (`first` for "cls",
    `mean`), the others' first token (`first`)."""
    if arch.head.pool == "modernbert":
        return "mean" if getattr(config, "classifier_pooling", "cls") == "mean" else "first"
    return arch.head.pool


def pooled(kind: str, output, attention_mask):
    """One vector per row from the encoder's output: BERT's pretrained pooler on the first token (`pooler`), the first
    token (`first`), or the mean or max over the row's real tokens (`attention_mask`'s; prompts a method puts in front
    count as tokens), as sentence-transformers pools (its Pooling module's cls, mean and max)."""
    if kind == "pooler":
        return output.pooler_output
    hidden = output.last_hidden_state
    if kind == "first":
        return hidden[:, 0]
    if kind == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / attention_mask.sum(dim=1, keepdim=True).to(hidden.dtype)
    if kind == "max":
        import torch

        padding = (attention_mask == 0).unsqueeze(-1)
        return hidden.masked_fill(padding, torch.finfo(hidden.dtype).min).max(dim=1).values
    raise ValueError(f"pooling {kind!r}: not one of pooler, first, mean, max")


def head_input(arch: Architecture, backbone, vector):
    """What the head's new layers read from the pooled vector: the vector itself, or for ModernBERT, after its
    pretrained head (dense, activation, norm), which its `*ForSequenceClassification` puts after its pooling."""
    return backbone.head(vector) if arch.head.pool == "modernbert" else vector


def activation_name(head: Head | MaskedLM, config) -> str | None:
    if head.activation is not None and head.activation.startswith("config:"):
        return getattr(config, head.activation.removeprefix("config:"))
    return head.activation


def mlm_transform(arch: Architecture, backbone, hidden):
    """The masked-LM head's transform of the encoder's output at the mask, norm(act(dense(h))), with the backbone's
    own (pretrained) layers, as its `*ForMaskedLM` computes it before the vocabulary projection."""
    from transformers.activations import ACT2FN

    mlm = arch.masked_lm
    dense = get(backbone, mlm.dense)(hidden)
    return get(backbone, mlm.norm)(ACT2FN[activation_name(mlm, backbone.config)](dense))
