"""Every peltbench method that PEFT 0.21 also implements, against PEFT, on every tiny encoder: one matrix.

Each row of ROWS is a method (or a setting of one) with its PEFT counterpart, and runs on every encoder of
tests/conftest.py (bert, roberta, electra, deberta-v2, modernbert: hidden 32, 2 layers, O(1) weights; here with
biases N(0, 0.5²) too, so that a method that scales or rotates W x around the bias shows it). A cell PEFT cannot do is
there all the same, skipped (PEFT computes something else) or expected to fail (PEFT refuses), with the reason.

    test_matches_peft       ours, every trained tensor moved off its init, and PEFT's model holding the same tensors
                            give on one batch of sentence pairs (one padded) the same logits, which differ from the
                            plain encoder's (the method matters), and the same loss (AdaLoRA: with its regulariser);
                            after one backward every entry of every tensor PEFT trains that is one of ours has our
                            gradient; every tensor we train is among them (but DeBERTa's new pooler under PEFT's
                            SEQ_CLS); no frozen tensor of ours has a gradient; our count is `count` (worked out by
                            hand) and PEFT's is ours plus `peft_extra`
    test_export_loads_in_peft   our copy, as a run with save.weights=true writes it (saving.save_weights), loads with
                            PeftModel.from_pretrained on the plain encoder without missing keys and predicts our logits
                            (head trained too); where peltbench writes no peft/, the log line says why (`no_export`)
    test_counts_on_base_models  our trainable count on roberta-base's and deberta-v3-base's shapes equals PEFT's
                            (its model built on the meta device) and the number `base_counts` cites (ECOSYSTEM.md)

Our tensors reach PEFT's model through our own export where peltbench writes one (the files a run saves, loaded with
PEFT's set_peft_model_state_dict), else by name (`renames`): no copying code per method. Which entry of PEFT's tensors
holds which of ours is found the same way, by loading tensors of entry numbers (`placement`), so ModernBERT's fused
Wqkv (PEFT's one LoRA of rank 2r with zero blocks, IA3's query block of ones, DoRA's k rows) needs no code here.

ADDING A METHOD (or an initialisation, or a setting) is adding a Row to ROWS, e.g. (the FourierFT row, shortened)

    # FourierFT: n coefficients per projection, 2 layers · 2 · 100 here; 12 · 2 · 1,000 = 24,000 on roberta-base
    Row("fourierft", method="fourierft",                    # test id; conf/method/fourierft.yaml
        tiny={"fourierft_n_frequency": 100},                # settings for the tiny models only (hidden 32)
        peft=lambda t, m: FourierFTConfig(n_frequency=m.fourierft_n_frequency, target_modules=QV[t],
                                          task_type="SEQ_CLS"),
        count=2 * 2 * 100,                                  # our trainable count on every tiny encoder (or a dict
                                                            # by encoder), by hand: the sum in the comment
        base_counts={"roberta-base": 24_000}),              # ours = PEFT's on the base model's shape = this

`peft(model_type, method)` turns our method config into PEFT's config (one factory for the tiny models and the base
shapes); QV, ATTENTION and LAYERS name each encoder's modules as PEFT targets them. `overrides` are settings that make
the row what it is (e.g. OFT's exact Cayley transform: {"oft_neumann_terms": 0}; an init: {"lora_init": "pissa"}),
applied everywhere. Every known difference is a field with a comment saying why:
    skip            encoder → why PEFT computes something else there (the cell is skipped)
    peft_refuses    encoder → why PEFT refuses it (get_peft_model raises: the cell must fail so, strict xfail)
    peft_extra      encoder → how many entries PEFT trains that are not ours (not the head), e.g. the k block of
                    ModernBERT's Wqkv in PEFT's one LoRA on it
    no_export       encoder or "*" → what saving's log line says instead of writing peft/ ("" if it says nothing);
                    our tensors then go into PEFT's by name, `renames` (our name fragment → PEFT's, PEFT's wrappers
                    taken out: plain_name) after `to_peft` (a change of layout, if any)
    prepare         (peft_model, model_type, method): a change to PEFT's model after get_peft_model (LoRA-FA: A frozen)
    peft_inputs     (model_type, input_ids, config, method) → extra inputs to PEFT's forward (position ids)
    same_draw       PEFT state-dict entries PEFT draws itself and must draw as we do (VeRA's A, B), checked first
    patch           (monkeypatch): what PEFT needs to run here (BOFT's CUDA extension)
    trained         (our model): what training leaves that an init lacks (AdaLoRA's masked triplets), for the export
    scale           how far the trained tensors are moved off their init (N(0, scale²) added)
    grad_close      a looser gradient tolerance (a function of PEFT's gradient), with the reason
    regularised     the loss has a regulariser, which must change it by over 0.1
    encoders        where a row is a setting that only one encoder has (adalora-wqkv: ModernBERT's fused q, k, v)

Tolerances: 1e-5 relative / 1e-6 absolute on logits and losses, 1e-5 of the tensor's scale on gradients
(conftest.assert_close_to_scale, as tests/test_encoders.py: float rounding of differently ordered sums) unless a row
says otherwise. Dropout is off. Each tiny encoder is built and each batch tokenized once per session; a cell copies
the encoder for its two models and runs one forward and one backward on each.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from conftest import ENCODERS, assert_close_to_scale, compose_config, tiny_encoder, tiny_tokenizer
from peltbench.methods import build_pelt_model, count_method, member_frozen, parameter_counts, regulariser
from peltbench.packaged import packaged_config
from peltbench.saving import member_weights, save_weights

pytest.importorskip("peft")
from peft import (AdaLoraConfig, BOFTConfig, C3AConfig, DeloraConfig, FourierFTConfig, HRAConfig,  # noqa: E402
                  IA3Config, LNTuningConfig, LoraConfig, OFTConfig, PeftModel, PrefixTuningConfig, PromptTuningConfig,
                  RoadConfig, VeraConfig, get_peft_model)
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict  # noqa: E402

MODEL_TYPES = sorted(ENCODERS)
CLOSE = dict(rtol=1e-5, atol=1e-6)
SEED = 42  # our model seed; VeRA's projection_prng_key
LABELS = torch.tensor([0, 1, 1])
# Each encoder's attention projections as PEFT names them (ModernBERT: q, k, v are row blocks of one Linear, Wqkv).
ATTENTION = {t: {"query": "query", "key": "key", "value": "value"} for t in ("bert", "roberta", "electra")}
ATTENTION["deberta-v2"] = {"query": "query_proj", "key": "key_proj", "value": "value_proj"}
ATTENTION["modernbert"] = {"query": "Wqkv", "key": "Wqkv", "value": "Wqkv"}
QV = {t: sorted({names["query"], names["value"]}) for t, names in ATTENTION.items()}
# A layer's path, as a regex for PEFT's target_modules.
LAYERS = {"bert": r"bert\.encoder\.layer\.\d+\.", "roberta": r"roberta\.encoder\.layer\.\d+\.",
          "electra": r"electra\.encoder\.layer\.\d+\.", "deberta-v2": r"deberta\.encoder\.layer\.\d+\.",
          "modernbert": r"model\.layers\.\d+\."}
# PEFT's SEQ_CLS trains `classifier` (modules_to_save) only: DeBERTa's new pooler.dense, which our head trains
# (`head: train`), stays frozen there. (Our export lists it in modules_to_save, so a copy has it.)
SEQ_CLS_LEAVES_FROZEN = {"deberta-v2": {"pooler.dense.weight", "pooler.dense.bias"}}
# deberta-v3-base's config.json (AutoConfig.for_model's deberta-v2 defaults are the xlarge model's shapes)
DEBERTA_V3_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                       relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256,
                       max_relative_positions=-1, share_att_key=True, norm_rel_ebd="layer_norm", type_vocab_size=0,
                       position_biased_input=False, vocab_size=128100)
BASE_MODELS = {"roberta-base": ("roberta", {}), "deberta-v3-base": ("deberta-v2", DEBERTA_V3_BASE)}


@dataclass(frozen=True)
class Row:
    """One method (or setting of one) against its PEFT counterpart; the module docstring says what each field is."""

    id: str
    method: str
    peft: Callable[[str, DictConfig], object]
    count: int | dict[str, int]
    overrides: dict = field(default_factory=dict)
    tiny: dict = field(default_factory=dict)
    skip: dict[str, str] = field(default_factory=dict)
    peft_refuses: dict[str, str] = field(default_factory=dict)
    peft_extra: dict[str, int] = field(default_factory=dict)
    no_export: dict[str, str] = field(default_factory=dict)
    renames: dict[str, str] = field(default_factory=dict)
    to_peft: Callable[[dict], dict] | None = None
    prepare: Callable | None = None
    peft_inputs: Callable | None = None
    same_draw: tuple[str, ...] = ()
    patch: Callable | None = None
    trained: Callable | None = None
    scale: float = 0.3
    grad_close: Callable[[torch.Tensor], dict] | None = None
    regularised: bool = False
    base_counts: dict[str, int] = field(default_factory=dict)
    encoders: tuple[str, ...] = tuple(MODEL_TYPES)

    def config(self, tiny: bool = True) -> DictConfig:
        """Our method config: the packaged one with the row's overrides (and, for the tiny models, its tiny ones)."""
        config = OmegaConf.create(OmegaConf.to_container(packaged_config(f"method/{self.method}.yaml")))
        for key, value in {**self.overrides, **(self.tiny if tiny else {})}.items():
            config[key] = value
        return config

    def expected_count(self, model_type: str) -> int:
        return self.count if isinstance(self.count, int) else self.count[model_type]

    def refusal(self, model_type: str) -> str | None:
        """What saving logs instead of writing peft/ for this cell; None where it writes peft/."""
        return self.no_export.get(model_type, self.no_export.get("*"))


# ---------------------------------------------------------------- PEFT's configs and what the rows need besides

def lora_config(t: str, m: DictConfig, **extra):
    """Our y = W x + s·B(A x) is PEFT's LoRA with lora_alpha = s·r. PEFT's own default targets (q, v: its
    TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, which must be ours); ModernBERT's q and v are blocks of
    Wqkv, which PEFT adapts whole: one LoRA of rank 2r, B zero outside the q and v blocks."""
    rank = m.lora_rank * (2 if t == "modernbert" else 1)
    return LoraConfig(r=rank, lora_alpha=m.lora_scale * rank, target_modules=["Wqkv"] if t == "modernbert" else None,
                      lora_dropout=0.0, **extra)


def converted_lora_config(t: str, m: DictConfig, **extra):
    """A PiSSA / OLoRA run (lora_init) as PEFT converts one (save_pretrained's path_initial_model_for_weight_conversion)
    and as peltbench exports it: a plain LoRA of rank 2r on the original W, A' = [A; A₀], B' = [B, −B₀], the scale kept
    (lora_alpha = s·2r); on ModernBERT's Wqkv, 2·2r. Its A₀, B₀ halves are PEFT's to train, frozen ours (peft_extra)."""
    rank = m.lora_rank * 2 * (2 if t == "modernbert" else 1)
    return LoraConfig(r=rank, lora_alpha=m.lora_scale * rank, target_modules=["Wqkv"] if t == "modernbert" else None,
                      lora_dropout=0.0, **extra)


# Ours cancels s·B₀(A₀x) against s·B(Ax) where PEFT sums one rank-2r product, and OLoRA's A₀ = R_r has rows of W's
# size: 2e-6 of the largest gradient entry, absolute (seen: 1.2e-6 on one of 256 entries, deberta-v2 OLoRA).
PRINCIPAL_CLOSE = lambda grad: dict(rtol=1e-5, atol=2e-6 * max(1.0, grad.abs().max().item()))  # noqa: E731


def freeze_lora_a(peft_model, model_type, method) -> None:
    """LoRA-FA: A frozen at its init, as PEFT's LoRA-FA optimizer (peft/optimizers/lorafa.py) leaves it."""
    for name, parameter in peft_model.named_parameters():
        if ".lora_A." in name:
            parameter.requires_grad_(False)


def ia3_config(t: str, m: DictConfig):
    """PEFT's IA3 on the paper's places (keys, values, the input of the FFN's second Linear), by a regex: PEFT's
    suffix `output.dense` would also match attention.output.dense (its default mapping adds it: 64,512 on
    roberta-base). ModernBERT's k and v are blocks of Wqkv: PEFT scales all its outputs (our export: 1 on q's)."""
    fused = t == "modernbert"
    ffn = LAYERS[t] + (r"mlp\.Wo" if fused else r"output\.dense")
    attention = r"attn\.Wqkv" if fused else rf"attention\.self\.({ATTENTION[t]['key']}|{ATTENTION[t]['value']})"
    return IA3Config(target_modules=f"{LAYERS[t]}({attention})|{ffn}", feedforward_modules=ffn, task_type="SEQ_CLS")


# The Linear each AdaLoRA target names in PEFT's model (a regex: `output.dense` alone would also match the
# attention output's).
ADALORA_NAMES = {t: {"query": rf"attention\.self\.{ATTENTION[t]['query']}", "key": rf"attention\.self\.{ATTENTION[t]['key']}",
                     "value": rf"attention\.self\.{ATTENTION[t]['value']}", "attention_output": r"attention\.output\.dense",
                     "intermediate": r"intermediate\.dense", "output": r"layer\.\d+\.output\.dense"}
                 for t in ("bert", "roberta", "electra", "deberta-v2")}
ADALORA_NAMES["modernbert"] = {"query": r"attn\.Wqkv", "key": r"attn\.Wqkv", "value": r"attn\.Wqkv",
                               "attention_output": r"attn\.Wo", "intermediate": r"mlp\.Wi", "output": r"mlp\.Wo"}


def adalora_config(t: str, m: DictConfig):
    names = ADALORA_NAMES[t]
    return AdaLoraConfig(
        task_type="SEQ_CLS", init_r=m.adalora_init_rank, target_r=m.adalora_target_rank, lora_alpha=m.adalora_alpha,
        target_modules=r".*\.(" + "|".join(sorted({names[target] for target in m.adalora_targets})) + r")$",
        lora_dropout=0.0, total_step=100, tinit=0, tfinal=0, deltaT=m.adalora_delta_t, beta1=m.adalora_beta1,
        beta2=m.adalora_beta2, orth_reg_weight=m.adalora_orth_reg)


def adalora_rank_3r(peft_model, model_type, method) -> None:
    """ModernBERT's Wqkv is one matrix to PEFT: rank 3r₀ there (PEFT gives every matrix init_r), and α tripled so
    that PEFT's α/rank is ours."""
    config = peft_model.peft_config["default"]
    for name, module in peft_model.named_modules():
        if name.endswith("Wqkv") and hasattr(module, "lora_E"):
            module.update_layer("default", 3 * method.adalora_init_rank, method.adalora_alpha, config=config)
            module.scaling["default"] = 3 * method.adalora_alpha


def adalora_stacked(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our q, k, v AdaLoRA blocks of Wqkv (`...Wqkv.adalora_query.lora_A` ...) as PEFT's one rank-3r₀ AdaLoRA on
    it: Q and Λ stacked [q; k; v], P block-diagonal."""
    out, blocks = {}, {}
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        if ".adalora_" in module:
            parent, _, target = module.rpartition(".adalora_")
            blocks.setdefault(parent, {})[(target, kind)] = tensor
        else:
            out[name] = tensor
    for module, parts in blocks.items():
        order = ("query", "key", "value")
        out[f"{module}.lora_A"] = torch.cat([parts[(t, "lora_A")] for t in order])
        out[f"{module}.lora_E"] = torch.cat([parts[(t, "lora_E")] for t in order])
        out[f"{module}.lora_B"] = torch.block_diag(*[parts[(t, "lora_B")] for t in order])
    return out


def masked_triplets(ours) -> None:
    """What AdaLoRA's budget leaves: some Λ entries zero, a different number per matrix (the export's rank_pattern)."""
    with torch.no_grad():
        for index, (name, parameter, _, _) in enumerate(ours.member_parameters()):
            if name.endswith("lora_E"):
                parameter[0, (torch.arange(parameter.shape[1]) + index) % 3 == 0] = 0


# Λ's gradient sums O(1) products over every position and both dimensions: 5e-6 of its largest entry, absolute.
ADALORA_CLOSE = lambda grad: dict(rtol=1e-5, atol=5e-6 * max(1.0, grad.abs().max().item()))  # noqa: E731
ADALORA_FUSED = "fused query, key, value as one matrix"


def road_config(t: str, m: DictConfig):
    """PEFT's RoAd on the Linears road_targets names, by the regex AdaLoRA's rows use (ModernBERT: all of Wqkv)."""
    names = ADALORA_NAMES[t]
    return RoadConfig(variant=f"road_{m.road_variant}", group_size=m.road_group_size, task_type="SEQ_CLS",
                      target_modules=r".*\.(" + "|".join(sorted({names[target] for target in m.road_targets})) + r")$")


def rotated(t: str, targets) -> list[str]:
    """The Linears a rotation of the inputs of `targets` sits on (ModernBERT: Wqkv, whose input q, k and v share)."""
    return sorted({ATTENTION[t][target] for target in targets})


def cuda_block_diag(monkeypatch) -> None:
    """PEFT computes m > 1 butterfly factors only with its CUDA block-diagonal extension; without it (a CPU) it
    silently sets m = 1. This stands in for the extension with what it computes (torch.block_diag of each factor's
    blocks), so PEFT's m = 2 path runs here (the counts show PEFT's m is ours)."""
    import peft.tuners.boft.layer as layer

    class BlockDiag:
        @staticmethod
        def apply(blocks):
            return torch.stack([torch.block_diag(*factor) for factor in blocks])

    monkeypatch.setattr(layer, "get_fbd_cuda", lambda: True)
    monkeypatch.setattr(layer, "FastBlockDiag", BlockDiag)


def positions_minus_prefix(model_type: str, ids: torch.Tensor, config, method) -> dict:
    """Our unshifted prefix (UniPELT's; P-tuning v2 with prefix_shift_positions=false) numbers the tokens from 0 as
    without it; PEFT's prefix tuning adds L to the position ids it is given: given the model's own minus L, it is ours."""
    length = method.prefix_length
    if model_type == "roberta":
        from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

        return {"position_ids": RobertaEmbeddings.create_position_ids_from_input_ids(ids, config.pad_token_id) - length}
    return {"position_ids": torch.arange(ids.shape[1]).expand_as(ids) - length}


# PEFT's prefix tuning passes past_key_values, which DeBERTa-v2 and ModernBERT do not take: get_peft_model refuses.
NO_PAST_KEY_VALUES = {"deberta-v2": "PEFT's prefix tuning needs past_key_values, which DeBERTa-v2 does not take",
                      "modernbert": "PEFT's prefix tuning needs past_key_values, which ModernBERT does not take"}
SHIFTS_POSITIONS = "PEFT's prefix tuning shifts every position id by the prefix length"


def prefix_config(t: str, m: DictConfig):
    return PrefixTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=m.prefix_length,
                              prefix_projection=m.get("prefix_projection", True),
                              encoder_hidden_size=m.get("prefix_hidden", 512))


ROWS = [
    # LoRA: A and B on q and v, 2 layers · 2 · (32·8 + 8·32); 294,912 on roberta-base (ECOSYSTEM.md). ModernBERT:
    # PEFT's B on Wqkv is 96 × 16, of which our q and v blocks are 2 · 32·8: 1,024 more entries per layer.
    Row("lora", method="lora", peft=lora_config, count=2 * 2 * (32 * 8 + 8 * 32),
        peft_extra={"modernbert": 2 * (96 * 16 - 2 * 32 * 8)},
        base_counts={"roberta-base": 294_912, "deberta-v3-base": 294_912}),
    # LoRA-FA: B only, 2 · 2 · 32·8 (A stays at its init; our copy carries it); ModernBERT as LoRA's B.
    Row("lora_fa", method="lora_fa", peft=lora_config, prepare=freeze_lora_a, count=2 * 2 * 32 * 8,
        peft_extra={"modernbert": 2 * (96 * 16 - 2 * 32 * 8)},
        base_counts={"roberta-base": 147_456, "deberta-v3-base": 147_456}),
    # DoRA: LoRA and m (32 per projection). ModernBERT: PEFT's m covers Wqkv's k rows too (our copy: ‖W_k‖, scale 1).
    Row("dora", method="dora", peft=lambda t, m: lora_config(t, m, use_dora=True),
        count=2 * 2 * (32 * 8 + 8 * 32 + 32), peft_extra={"modernbert": 2 * (96 * 16 - 2 * 32 * 8 + 32)},
        base_counts={"roberta-base": 313_344, "deberta-v3-base": 313_344}),
    # LoRA and DoRA started from PiSSA or OLoRA (method.lora_init), against PEFT's converted form of such a run, a LoRA
    # (DoRA) of rank 2r on the original W (converted_lora_config): PEFT trains our A, B and the halves holding A₀, −B₀,
    # 4 · (8·32 + 32·8) more (ModernBERT: rank 32 on Wqkv, 2 · (32·32 + 96·32) less ours; DoRA's m over its k rows too).
    # That the start is PEFT's own pissa_init / olora_init, and the model PEFT's on W_res: tests/test_lora_init.py.
    *[Row(f"{name}-{init}", method=name, overrides={"lora_init": init},
          peft=lambda t, m, dora=(name == "dora"): converted_lora_config(t, m, use_dora=dora),
          count=2 * 2 * (32 * 8 + 8 * 32 + (32 if name == "dora" else 0)),
          peft_extra={t: 2 * 2 * (32 * 8 + 8 * 32) if t != "modernbert" else
                      2 * (32 * 32 + 96 * 32 - 2 * (32 * 8 + 8 * 32) + (96 - 64 if name == "dora" else 0))
                      for t in MODEL_TYPES}, grad_close=PRINCIPAL_CLOSE)
      for name in ("lora", "dora") for init in ("pissa", "olora")],
    # VeRA: λ_b (32) and λ_d (r) per projection, r = 64 here; A and B drawn from our model seed are PEFT's from
    # projection_prng_key. r = 1,024 by default: 12 · 2 · (1,024 + 768) = 43,008 on roberta-base (ECOSYSTEM.md).
    Row("vera", method="vera", tiny={"vera_rank": 64},
        peft=lambda t, m: VeraConfig(r=m.vera_rank, projection_prng_key=SEED, vera_dropout=0.0, d_initial=m.vera_d_initial),
        count=2 * 2 * (64 + 32), same_draw=("base_model.vera_A", "base_model.vera_B"),
        skip={"modernbert": "PEFT's VeRA adapts the whole fused Wqkv with one λ_d and a B of 3H rows for q, k and v, "
                            "not VeRA on its q and v blocks (tests/test_vera.py checks ours against the formula)"},
        no_export={"modernbert": "VeRA on its q and v blocks has no PEFT form"},
        base_counts={"roberta-base": 43_008, "deberta-v3-base": 43_008}),
    # AdaLoRA on all six matrices of a layer: per matrix r₀ = 12 triplets (P column, λ, Q row), 2 layers. The initial
    # budget is PEFT's count: 12 · 12 · (4 · (768 + 768 + 1) + 2 · (768 + 3,072 + 1)) = 1,991,520 on both base models.
    Row("adalora", method="adalora", peft=adalora_config, regularised=True, trained=masked_triplets,
        count=2 * 12 * (4 * (32 + 32 + 1) + 2 * (32 + 64 + 1)), grad_close=ADALORA_CLOSE,
        skip={"modernbert": "PEFT adapts Wqkv as one matrix, with one budget and a regulariser coupling its q, k, v "
                            "blocks: row adalora-wqkv compares with the regulariser off, adalora-dense the rest"},
        no_export={"modernbert": ADALORA_FUSED},
        base_counts={"roberta-base": 1_991_520, "deberta-v3-base": 1_991_520}),
    # ModernBERT's q, k, v with the regulariser off, against PEFT's rank-3r₀ AdaLoRA on Wqkv (adalora_rank_3r), P
    # block-diagonal: its off-diagonal blocks, 96 · 36 − 3 · 32 · 12 per layer, are not ours. ModernBERT's FFN Wi is
    # 32 → 128 (gated: 2 · 64).
    Row("adalora-wqkv", method="adalora", overrides={"adalora_orth_reg": 0.0}, peft=adalora_config,
        prepare=adalora_rank_3r, to_peft=adalora_stacked, encoders=("modernbert",), grad_close=ADALORA_CLOSE,
        count=2 * 12 * (4 * (32 + 32 + 1) + (32 + 128 + 1) + (64 + 32 + 1)),
        peft_extra={"modernbert": 2 * (96 * 36 - 3 * 32 * 12)}, no_export={"modernbert": ADALORA_FUSED}),
    Row("adalora-dense", method="adalora", overrides={"adalora_targets": ["attention_output", "intermediate", "output"]},
        peft=adalora_config, regularised=True, trained=masked_triplets, grad_close=ADALORA_CLOSE,
        count={t: 2 * 12 * ((32 + 32 + 1) + (32 + (128 if t == "modernbert" else 64) + 1) + (64 + 32 + 1))
               for t in MODEL_TYPES}),
    # OFT, block size 8 on hidden 32: 4 blocks of 8·7/2 skew entries per rotated Linear (ModernBERT: Wqkv's input
    # alone). Cayley-Neumann with 5 terms (PEFT's default) or the exact Cayley transform. b = 32 by default: 24 · 24
    # blocks · 496 = 285,696 on roberta-base (ECOSYSTEM.md).
    *[Row(f"oft-{kind}", method="oft", overrides={"oft_neumann_terms": terms}, tiny={"oft_block_size": 8},
          peft=lambda t, m: OFTConfig(oft_block_size=m.oft_block_size, target_modules=rotated(t, m.oft_targets),
                                      use_cayley_neumann=m.oft_neumann_terms > 0, task_type="SEQ_CLS",
                                      num_cayley_neumann_terms=max(m.oft_neumann_terms, 1)),
          count={t: 2 * 4 * 28 * (1 if t == "modernbert" else 2) for t in MODEL_TYPES},
          base_counts={"roberta-base": 285_696})
      for kind, terms in (("neumann", 5), ("exact", 0))],
    # HRA, r = 4 reflections of 32 per Linear, as PEFT's product or its Gram-Schmidt form. r = 8 by default: 24 · 768
    # · 8 = 147,456 on roberta-base (ECOSYSTEM.md).
    *[Row(f"hra-{kind}", method="hra", overrides={"hra_apply_gs": gs}, tiny={"hra_rank": 4},
          peft=lambda t, m: HRAConfig(r=m.hra_rank, apply_GS=m.hra_apply_gs, target_modules=rotated(t, m.hra_targets),
                                      task_type="SEQ_CLS"),
          count={t: 2 * 32 * 4 * (1 if t == "modernbert" else 2) for t in MODEL_TYPES},
          grad_close=(lambda grad: dict(rtol=1e-5, atol=1e-5)) if gs else None,  # Gram-Schmidt's sums: 1e-5
          base_counts={"roberta-base": 147_456})
      for kind, gs in (("product", False), ("gram-schmidt", True))],
    # BOFT, b = 4: m factors of 8 blocks of 4 × 4 per rotated Linear and s per output (ModernBERT: Wqkv, 96 outputs).
    # With the default b = 8: 24 · (m · 96 · 8 · 8 + 768) on roberta-base, 313,344 at m = 2 and 165,888 at m = 1,
    # the number ECOSYSTEM.md has from PEFT without its CUDA extension (see cuda_block_diag).
    *[Row(f"boft-m{factors}", method="boft", overrides={"boft_factors": factors}, tiny={"boft_block_size": 4},
          peft=lambda t, m: BOFTConfig(boft_block_size=m.boft_block_size, boft_n_butterfly_factor=m.boft_factors,
                                       target_modules=rotated(t, m.boft_targets), task_type="SEQ_CLS"),
          patch=cuda_block_diag,
          count={t: (2 if t == "modernbert" else 4) * (factors * 8 * 4 * 4 + (96 if t == "modernbert" else 32))
                 for t in MODEL_TYPES},
          base_counts={"roberta-base": 313_344 if factors == 2 else 165_888})
      for factors in (2, 1)],
    # (IA)³: keys, values (32 each) and the FFN's intermediate (64) per layer; 12 · (768 + 768 + 3,072) = 55,296 on
    # roberta-base. ModernBERT: PEFT's vector on Wqkv's 96 outputs holds our k and v; its q block (32) is not ours.
    Row("ia3", method="ia3", peft=ia3_config, count=2 * (32 + 32 + 64), peft_extra={"modernbert": 2 * 32},
        base_counts={"roberta-base": 55_296, "deberta-v3-base": 55_296}),
    # RoAd on every Linear of a layer (conf/method/road.yaml): θ and α, out · v/2 each per Linear (road_v), 2 layers ·
    # v · (4 · 32 + 64 + 32) (ModernBERT: its GLU's Wi has 128 outputs). road_1 on roberta-base and deberta-v3-base:
    # 12 · (4 · 768 + 3,072 + 768) = 82,944 (the paper's 0.07 %; PEFT's count), road_2 twice, road_4 four times that.
    *[Row(f"road-{variant}-g{group}", method="road", overrides={"road_variant": variant, "road_group_size": group},
          peft=road_config, count={t: 2 * variant * (4 * 32 + (128 if t == "modernbert" else 64) + 32)
                                   for t in MODEL_TYPES},
          base_counts={"roberta-base": 82_944 * variant, "deberta-v3-base": 82_944 * variant})
      for variant, group in ((1, 2), (2, 8), (4, 16))],
    # RoAd on q and v (PEFT's default targets): 2 layers · 2 · 32. ModernBERT: PEFT's RoAd on Wqkv rotates its k rows
    # too (θ = 0, α = 1 in our copy): 2 layers · 32 more. 12 · 2 · 768 = 18,432 on roberta-base.
    Row("road-qv", method="road", overrides={"road_targets": ["query", "value"]}, peft=road_config, count=2 * 2 * 32,
        peft_extra={"modernbert": 2 * 32}, base_counts={"roberta-base": 18_432, "deberta-v3-base": 18_432}),
    # DeLoRA: A (r × 32), B (32 × r) and λ per projection, 2 layers · 2; r = 8, λ = 4 (conf/method/delora.yaml) and
    # r = 3, λ = 12. 12 · 2 · (8·768 + 768·8 + 1) = 294,936 on roberta-base (PEFT's count).
    *[Row(f"delora-r{rank}", method="delora", overrides={"delora_rank": rank, "delora_lambda": lam},
          peft=lambda t, m: DeloraConfig(r=m.delora_rank, delora_lambda=m.delora_lambda, target_modules=QV[t],
                                         task_type="SEQ_CLS"),
          count=2 * 2 * (rank * 32 + 32 * rank + 1),
          skip={"modernbert": "PEFT's DeLoRA adapts the whole fused Wqkv with one λ and W's column norms over its 96 "
                              "rows, not DeLoRA on its q and v blocks (tests/test_delora.py checks each block against "
                              "PEFT's DeloraLinear on a Linear of that block)"},
          no_export={"modernbert": "DeLoRA on its q and v blocks has no PEFT form"},
          base_counts={"roberta-base": 294_936, "deberta-v3-base": 294_936} if rank == 8 else {})
      for rank, lam in ((8, 4.0), (3, 12.0))],
    # FourierFT: n coefficients per projection, 2 layers · 2 · 100 here; 12 · 2 · 1,000 = 24,000 on roberta-base (the
    # paper's count). α = 20 on the tiny models: IDFT2 divides by out · in, and the paper's 140 on a 32 × 32 spectrum
    # makes ΔW's entries ~1, five times W's (tests/test_fourierft.py, which also checks PEFT draws the same c and
    # entries from the same seeds).
    Row("fourierft", method="fourierft", tiny={"fourierft_n_frequency": 100, "fourierft_scaling": 20.0},
        peft=lambda t, m: FourierFTConfig(n_frequency=m.fourierft_n_frequency, scaling=m.fourierft_scaling,
                                          random_loc_seed=m.fourierft_entry_seed, target_modules=QV[t],
                                          task_type="SEQ_CLS"),
        count=2 * 2 * 100,
        skip={"modernbert": "PEFT's FourierFT adapts the whole fused Wqkv with one 3H × H spectrum, not FourierFT on its "
                            "q and v blocks (tests/test_fourierft.py checks ours against the formula)"},
        no_export={"modernbert": "FourierFT on its q and v blocks (an H × H spectrum each) has no PEFT form"},
        base_counts={"roberta-base": 24_000, "deberta-v3-base": 24_000}),
    # C3A: (32 / b)² kernels of length b per projection, b = 8 here (the paper's 128 cannot tile 32): 2 · 2 · 128.
    # ModernBERT: PEFT's C3A on Wqkv has kernels for its k rows too (zero in our copy): 2 layers · 128 more. Kernels
    # moved by N(0, 2²): the xavier init's ΔW (~0.006 after PEFT's 1/in at hidden 32) barely moves the logits.
    # 12 · 2 · 768² / 128 = 110,592 on roberta-base (the paper's 0.111M).
    Row("c3a", method="c3a", tiny={"c3a_block_size": 8},
        peft=lambda t, m: C3AConfig(block_size=m.c3a_block_size, target_modules=QV[t], task_type="SEQ_CLS"),
        count=2 * 2 * 32 * 32 // 8, peft_extra={"modernbert": 2 * 32 * 32 // 8}, scale=2.0,
        base_counts={"roberta-base": 110_592, "deberta-v3-base": 110_592}),
    # Prompt tuning: 20 prompts of the word embeddings' width (ELECTRA's is 16, below its hidden 32: PEFT's
    # token_dim); 20 · 768 = 15,360 on roberta-base.
    Row("prompt", method="prompt",
        peft=lambda t, m: PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=m.prompt_length,
                                             token_dim=16 if t == "electra" else None),
        count={t: 20 * (16 if t == "electra" else 32) for t in MODEL_TYPES}, base_counts={"roberta-base": 15_360}),
    # P-tuning v2: the L × 2 · layers · H prefix trained directly, the tokens' positions after it as PEFT numbers
    # them (prefix_shift_positions, the default); 20 · 2 · 12 · 768 = 368,640 on roberta-base.
    Row("ptuning_v2", method="ptuning_v2", peft=prefix_config, count=20 * 2 * 2 * 32, peft_refuses=NO_PAST_KEY_VALUES,
        renames={"prefix_encoder.key_values": "prompt_encoder.embedding.weight"},
        no_export={"*": "P-tuning v2 run with shifted positions computes what PEFT's prefix tuning computes on BERT "
                        "and RoBERTa, but its export is not implemented"},
        base_counts={"roberta-base": 368_640}),
    # The same with the tokens numbered from 0 (UniPELT's prefix; ptuning_v2 records before the setting).
    Row("ptuning_v2-unshifted", method="ptuning_v2", overrides={"prefix_shift_positions": False}, peft=prefix_config,
        peft_inputs=positions_minus_prefix, count=20 * 2 * 2 * 32, peft_refuses=NO_PAST_KEY_VALUES,
        renames={"prefix_encoder.key_values": "prompt_encoder.embedding.weight"}, no_export={"*": SHIFTS_POSITIONS}),
    # Prefix-tuning (UniPELT's): P = Embedding(10, 32) through the MLP 32 → 512 → 2 · layers · 32, PEFT's
    # prefix_projection, the tokens numbered from 0. We count the 10 × 128 prefix kept after training, PEFT the
    # embedding and MLP it trains: 10 · 32 + 32 · 512 + 512 + 512 · 128 + 128. Our head stays frozen (PEFT's SEQ_CLS
    # trains it: not compared). The MLP's outputs sum 512 terms: moved by 0.05, not 0.3, its softmax keeps gradients.
    Row("prefix", method="prefix", peft=prefix_config, peft_inputs=positions_minus_prefix, count=10 * 2 * 2 * 32,
        peft_extra={t: 10 * 32 + 32 * 512 + 512 + 512 * 128 + 128 - 10 * 2 * 2 * 32 for t in MODEL_TYPES},
        renames={"prefix_encoder.embedding": "prompt_encoder.embedding.weight",
                 "prefix_encoder.down.": "prompt_encoder.transform.0.", "prefix_encoder.up.": "prompt_encoder.transform.2."},
        scale=0.05, peft_refuses=NO_PAST_KEY_VALUES, no_export={"*": SHIFTS_POSITIONS}),
    # LN-tuning: every LayerNorm's gain and bias (embeddings, 2 per layer; DeBERTa's relative embeddings' too; ELECTRA's
    # embeddings' is 16 wide): bert, roberta 5 · 64, electra 32 + 4 · 64, deberta-v2 6 · 64. PEFT's LNTuningConfig
    # trains a copy of each LayerNorm it names. Base shapes (ECOSYSTEM.md): 25 · 1,536 = 38,400; DeBERTa-v3 39,936.
    Row("ln", method="ln", peft=lambda t, m: LNTuningConfig(target_modules=["LayerNorm"], task_type="SEQ_CLS"),
        count={"bert": 320, "roberta": 320, "electra": 288, "deberta-v2": 384, "modernbert": 384},
        skip={"modernbert": "ModernBERT's LayerNorms have no bias: ours adds one at zero and trains it (docs/protocol.md "
                            "§9), PEFT's LN tuning trains what each LayerNorm has"},
        no_export={"*": ""},  # peltbench writes no PEFT copy of an LN-tuning run (saving.peft_kind), and says nothing
        base_counts={"roberta-base": 38_400, "deberta-v3-base": 39_936}),
]


def cells(export: bool = False):
    """(row, encoder) for every cell, marked where PEFT cannot do it; for the export test, a cell whose export
    peltbench refuses runs all the same (the refusal is what it checks)."""
    for row in ROWS:
        for model_type in row.encoders:
            marks = []
            if export and row.refusal(model_type) is not None:
                pass
            elif model_type in row.skip:
                marks = [pytest.mark.skip(reason=row.skip[model_type])]
            elif model_type in row.peft_refuses:
                marks = [pytest.mark.xfail(reason=row.peft_refuses[model_type], raises=ValueError, strict=True)]
            yield pytest.param(row, model_type, marks=marks, id=f"{row.id}-{model_type}")


# ---------------------------------------------------------------- the tiny encoders and a batch, once per session

@pytest.fixture(scope="session")
def encoder():
    """The plain tiny encoder of a type (dropout off, O(1) weights, biases N(0, 0.5²)), built once: copy it to change it."""
    built = {}

    def get(model_type: str):
        if model_type not in built:
            model = tiny_encoder(model_type, dropout=0.0)
            generator = torch.Generator().manual_seed(6)
            with torch.no_grad():  # HF starts biases at 0
                for name, parameter in model.named_parameters():
                    if name.endswith("bias"):
                        parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
            built[model_type] = model
        return built[model_type]
    return get


@pytest.fixture(scope="session")
def inputs():
    """A batch of three sentence pairs per encoder, one padded (two more words than the other), tokenized once."""
    pairs = (["the cat sat on the mat with a big dog", "a dog ran", "good movie"],
             ["it was very good", "the man runs", "not a sad film and not a happy one"])
    made = {}

    def get(model_type: str) -> dict:
        if model_type not in made:
            encoded = tiny_tokenizer(model_type)(*pairs, padding=True, return_tensors="pt")
            made[model_type] = {name: encoded[name] for name in ("input_ids", "attention_mask", "token_type_ids")
                                if name in encoded}
        return made[model_type]
    return get


@pytest.fixture(scope="session")
def run_config():
    """What save_weights reads of a run's config (model, task, model seed 42, config hash); the method is the cell's."""
    return compose_config("method=lora", "task=rte", "model.name=tiny")


# ---------------------------------------------------------------- our model, PEFT's, and our tensors into PEFT's

def build_ours(row: Row, base):
    method = row.config()
    return build_pelt_model(copy.deepcopy(base), method, SEED, [base]), method


def build_peft(row: Row, model_type: str, base, method, monkeypatch):
    if row.patch is not None:
        row.patch(monkeypatch)
    peft_model = get_peft_model(copy.deepcopy(base), row.peft(model_type, method))
    if row.prepare is not None:
        row.prepare(peft_model, model_type, method)
    return peft_model


def logits_of(ours, batch: dict) -> torch.Tensor:
    return ours(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))


def trained_names(ours) -> list[str]:
    """What our member trains (the head where it does), under the plain model's names, in member_weights' order."""
    return [ours.stored_name(name) for name, _, _, _ in ours.member_parameters()]


def move_off_init(ours, scale: float, head: bool = False) -> None:
    """Every tensor the method trains (and the head, if `head`) moved by N(0, scale²): nothing at its init (B = 0,
    λ_b = 0, R = I, m = ‖W‖, symmetric HRA pairs ...), so that every term of the method shows."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter, _, stacked in ours.member_parameters():
            if head or not name.startswith("head."):
                target = parameter[0] if stacked else parameter
                target.add_(scale * torch.randn(target.shape, generator=generator))


def export(ours, method, cfg, folder, tensors=None) -> dict[str, torch.Tensor] | None:
    """Our member as a run with save.weights=true saves it (runner._finish); PEFT's state dict from its peft/, or
    None where it writes none."""
    from safetensors.torch import load_file

    folder.mkdir(parents=True)
    cfg = copy.deepcopy(cfg)
    cfg.method = method
    tensors = member_weights(ours, 0, method, ours.config) if tensors is None else tensors
    save_weights(folder, tensors, cfg, ours.arch, member_frozen(ours, 0, method))
    path = folder / "peft" / "adapter_model.safetensors"
    return load_file(path) if path.exists() else None


def plain_name(peft_name: str) -> str:
    """A PEFT parameter's name as the plain model (and our stored names) have it: PEFT's wrappers taken out."""
    name = peft_name.removeprefix("base_model.model.") if peft_name.startswith("base_model.model.") else \
        peft_name.removeprefix("base_model.")
    for wrapper in (".modules_to_save.default", ".ln_tuning_layers.default", ".default"):
        name = name.replace(wrapper, "")
    return name


def load_by_name(row: Row, peft_model, tensors: dict[str, torch.Tensor]) -> None:
    """Each of our tensors into the PEFT parameter of its name (after `to_peft` and `renames`)."""
    homes = {plain_name(name): parameter for name, parameter in peft_model.named_parameters()
             if ".original_module." not in name}
    with torch.no_grad():
        for name, tensor in (row.to_peft(tensors) if row.to_peft else tensors).items():
            for ours, theirs in row.renames.items():
                name = name.replace(ours, theirs)
            assert name in homes, f"PEFT has no parameter {name}"
            homes[name].copy_(tensor.view(homes[name].shape))


def load_into_peft(row: Row, model_type: str, peft_model, ours, method, cfg, folder, tensors) -> None:
    """Our tensors into PEFT's model: through our export where peltbench writes one, else by name."""
    if row.refusal(model_type) is not None:
        load_by_name(row, peft_model, tensors)
        return
    state = export(ours, method, cfg, folder, tensors)
    assert state is not None, "no peft/ written"
    result = set_peft_model_state_dict(peft_model, state)
    # PEFT loads prompt_embeddings itself; DeBERTa's pooler is in our copy's modules_to_save, not in PEFT's SEQ_CLS
    assert not [key for key in result.unexpected_keys if key != "prompt_embeddings" and ".pooler." not in key], \
        result.unexpected_keys


OFFSET = 2.0**22  # entry numbers OFFSET + i: exact in float32 (below 2**24) and far from any weight


def placement(row, model_type, peft_model, ours, method, cfg, folder, weights) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Our `weights` (member_weights) into PEFT's model, and for each PEFT tensor: (which of its entries hold one of
    ours, and which: the index into our trained tensors flattened in order). Our trained tensors are loaded numbered
    entry by entry (the rest as they are) the way any would be, so the map is the export's own; then each numbered
    entry takes our value."""
    numbered, values, start = dict(weights), [], 0
    for name in trained_names(ours):
        size = weights[name].numel()
        numbered[name] = OFFSET + torch.arange(start, start + size, dtype=torch.float32).view(weights[name].shape)
        values.append(weights[name].reshape(-1))
        start += size
    load_into_peft(row, model_type, peft_model, ours, method, cfg, folder, numbered)
    values, where = torch.cat(values), {}
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            held = parameter >= OFFSET - 0.5
            where[name] = (held, (parameter[held] - OFFSET).round().long())
            parameter[held] = values[where[name][1]]
    return where


def our_flat_gradients(ours, weights: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[str]]:
    """Our member's gradients flattened in placement's order, and the name of each entry's tensor."""
    grads, owners = [], []
    for name, parameter, _, stacked in ours.member_parameters():
        stored = ours.stored_name(name)
        grad = parameter.grad[0] if stacked else parameter.grad
        grad = torch.zeros_like(weights[stored]) if grad is None else grad[tuple(slice(0, s) for s in weights[stored].shape)]
        grads.append(grad.reshape(-1))
        owners += [stored] * grad.numel()
    return torch.cat(grads), owners


# ---------------------------------------------------------------- the checks

@pytest.mark.parametrize("row,model_type", list(cells()))
def test_matches_peft(row, model_type, encoder, inputs, run_config, tmp_path, monkeypatch):
    base, batch = encoder(model_type), inputs(model_type)
    ours, method = build_ours(row, base)
    peft_model = build_peft(row, model_type, base, method, monkeypatch)
    if row.same_draw:  # drawn by PEFT itself: compared before anything of ours is copied in
        ours_state, peft_state = export(ours, method, run_config, tmp_path / "draw"), get_peft_model_state_dict(peft_model)
        for name in row.same_draw:
            assert torch.equal(peft_state[name], ours_state[name]), name
    move_off_init(ours, row.scale)
    weights = member_weights(ours, 0, method, ours.config)
    where = placement(row, model_type, peft_model, ours, method, run_config, tmp_path / "copy", weights)
    ours.train(), peft_model.train()  # as in training (dropout is off)

    logits = logits_of(ours, batch)
    extra = row.peft_inputs(model_type, batch["input_ids"], base.config, method) if row.peft_inputs else {}
    output = peft_model(**batch, **extra, labels=LABELS)
    torch.testing.assert_close(logits, output.logits, **CLOSE)
    with torch.no_grad():
        assert (logits - base(**batch).logits).abs().max() > 1e-2  # the method matters
    penalty = regulariser(ours)
    loss = F.cross_entropy(logits, LABELS) + (0 if penalty is None else penalty[0])
    torch.testing.assert_close(loss, output.loss, **CLOSE)
    if row.regularised:
        assert (loss - F.cross_entropy(logits, LABELS)).item() > 0.1  # the regulariser counts
    loss.backward()
    output.loss.backward()

    trained = set(trained_names(ours))
    assert not [n for n, p in ours.named_parameters() if p.grad is not None and ours.stored_name(n) not in trained]
    ours_grads, owners = our_flat_gradients(ours, weights)
    reached, peft_count = set(), 0
    for name, parameter in peft_model.named_parameters():
        if not parameter.requires_grad:
            continue
        held, index = where[name]
        grad = torch.zeros_like(parameter) if parameter.grad is None else parameter.grad
        if row.grad_close:
            torch.testing.assert_close(ours_grads[index], grad[held], **row.grad_close(grad), msg=lambda m: f"{name}: {m}")
        else:
            assert_close_to_scale(ours_grads[index], grad[held], msg=name)
        reached |= {owners[i] for i in index.unique().tolist()}
        peft_count += 0 if ".modules_to_save." in name else parameter.numel()
    assert trained - reached == trained & SEQ_CLS_LEAVES_FROZEN.get(model_type, set())
    count = parameter_counts(ours)["trainable_params"]
    assert count == row.expected_count(model_type)
    assert peft_count == count + row.peft_extra.get(model_type, 0)


@pytest.mark.parametrize("row,model_type", list(cells(export=True)))
def test_export_loads_in_peft(row, model_type, encoder, inputs, run_config, tmp_path, monkeypatch, caplog):
    from test_encoders import reference_head

    base, batch = encoder(model_type), inputs(model_type)
    ours, method = build_ours(row, base)
    move_off_init(ours, row.scale, head=True)
    if row.trained is not None:
        row.trained(ours)
    with caplog.at_level(logging.INFO, logger="peltbench"):
        state = export(ours, method, run_config, tmp_path / "run")
    refusal = row.refusal(model_type)
    if refusal is not None:
        assert state is None and not (tmp_path / "run" / "peft").exists()
        said = [record.message for record in caplog.records if "no peft/ copy" in record.message]
        assert [refusal in message for message in said] == ([True] if refusal else [])
        return
    if row.patch is not None:
        row.patch(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copied = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "run" / "peft").eval()
    assert not [w for w in caught if "missing adapter keys" in str(w.message)]
    ours.eval()
    with torch.no_grad():
        logits = logits_of(ours, batch)
        torch.testing.assert_close(copied(**batch).logits, logits, **CLOSE)
        plain = copy.deepcopy(base)
        reference_head(plain, ours)  # our head on the plain encoder: the method's tensors came across too
        assert (plain(**batch).logits - logits).abs().max() > 1e-2


BASE_CELLS = [pytest.param(row, name, id=f"{row.id}-{name}") for row in ROWS for name in row.base_counts]


@pytest.mark.parametrize("row,base_model", BASE_CELLS)
def test_counts_on_base_models(row, base_model, monkeypatch):
    """Our count of the method as configured (the row's `tiny` settings aside) on a base model's shape, PEFT's count
    of its trainable tensors (the head aside) on that model built on the meta device, and the number cited."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model_type, changes = BASE_MODELS[base_model]
    config, method = AutoConfig.for_model(model_type, num_labels=2, **changes), row.config(tiny=False)
    if row.patch is not None:
        row.patch(monkeypatch)
    with torch.device("meta"):  # no weights; PEFT makes its own where the base layer is (BOFT computes on the CPU)
        plain = AutoModelForSequenceClassification.from_config(config)
    peft_model = get_peft_model(plain, row.peft(model_type, method))
    if row.prepare is not None:
        row.prepare(peft_model, model_type, method)
    # AdaLoRA's ranknum (its rank as a constant, requires_grad=False) comes back trainable from PEFT's move to meta
    peft_count = sum(p.numel() for n, p in peft_model.named_parameters()
                     if p.requires_grad and ".modules_to_save." not in n and ".ranknum." not in n)
    assert count_method(method, config)["trainable_params"] == peft_count == row.base_counts[base_model]
