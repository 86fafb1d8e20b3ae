"""What a run may keep beside its result.json: its trained tensors, its test predictions, a PEFT copy of the run.

    save.weights=true       weights.safetensors: what the method trains (PELT modules, gates; for fine-tuning the
                            whole model) and the head, each tensor at the run's own size, under the plain Hugging Face model's
                            names (`bert.encoder.layer.3.output.LayerNorm.weight`, `...output.adapter.down.weight`,
                            `classifier.weight`); its metadata names the method, model and task. A plain LoRA, LoRA-FA,
                            DoRA, VeRA, AdaLoRA, OFT, HRA, BOFT, (IA)³, prompt-tuning, RoAd, DeLoRA, FourierFT or C3A run
                            (ungated, alone) also writes peft/, which `PeftModel.from_pretrained` loads, where PEFT has
                            the method on that encoder (peft_kind); a run PEFT cannot express there (a prefix run ...)
                            says why in one log line.
    save.predictions=true   predictions.csv: one row per test example, in the official dev split's order: its label,
                            the prediction and (classification) the logits.

`peltbench.load_run(run_dir)` (runner.py) rebuilds a saved run on its backbone; `read_weights` and `check_weights`
make a file that is not this run's (cut short, empty, another method's) one line naming it. Every file is written
whole (a temporary file renamed into place) with the umask's mode, as records are (peltbench.files).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import torch

from . import UserError, __version__
from .cloze import is_cloze
from .files import write_file, write_with
from .component import declaration
from .methods import component, label_words, member_head, member_shapes, member_state
from .record import SAVED, config_hash

WEIGHTS = SAVED["weights"]
TEMPORARY = ".save."  # files.TEMPORARY_PREFIXES: what a killed run leaves is removed by the next run of the record
PREDICTIONS = SAVED["predictions"]
PEFT_DIR = "peft"
log = logging.getLogger("peltbench")
PEFT_FORMULAS = "0.21.0"  # the PEFT release whose formulas the exports reproduce (OFT's Cayley-Neumann changed in 0.18)


def member_weights(model, slot: int, method, config) -> dict[str, torch.Tensor]:
    """Member `slot`'s trained tensors, each cut to the member's own size (a group pads smaller members), and its
    head even where the method leaves it frozen at its random init (prefix, LoRA): a copy needs it."""
    state = member_state(model, slot)
    tensors = {name: state[name][tuple(slice(0, n) for n in shape)].contiguous().cpu()
               for name, shape in member_shapes(method, config, label_words(model)).items()}
    tensors.update({name: tensor.cpu() for name, tensor in member_head(model, slot).items()})
    return tensors


def save_weights(run_dir: Path, tensors: dict[str, torch.Tensor], cfg, arch,
                 frozen: dict[str, torch.Tensor] | None = None, model_config=None) -> list[str]:
    """weights.safetensors (and peft/ for a run PEFT can load, see peft_refusal); the files written, relative to
    run_dir. `frozen`: what a copy needs beside the trained tensors (methods.member_frozen: LoRA-FA's A, VeRA's A, B).
    `model_config`: the backbone's config (ModernBERT's classifier_pooling decides what its head pools)."""
    from omegaconf import OmegaConf

    metadata = {"peltbench": __version__, "model": str(cfg.model.name), "task": cfg.task.name,
                "method": json.dumps(OmegaConf.to_container(cfg.method, resolve=True)), "config_hash": config_hash(cfg)}
    write_with(run_dir / WEIGHTS, lambda path: save_safetensors(tensors, path, metadata), TEMPORARY)
    written = [WEIGHTS]
    kind, refusal = peft_kind(cfg.method, arch)
    if kind is not None and is_cloze(cfg):
        kind, refusal, tensors = _cloze_peft(kind, cfg, tensors)
    elif kind is not None:  # the classifier: PEFT's SEQ_CLS model pools as the architecture's own head
        refusal = other_pooling(cfg, arch, model_config)
        kind = None if refusal else kind
    if kind is not None:
        [name] = cfg.method.components
        own = hasattr(component(str(name)), "peft_export")  # a component that writes its own PEFT form
        export = export_own if own else EXPORTS[kind]
        written += export(run_dir / PEFT_DIR, {**tensors, **(frozen or {})} if own or kind in WITH_FROZEN else tensors,
                          cfg, arch)
        if is_cloze(cfg):
            _for_masked_lm(run_dir / PEFT_DIR)
    elif refusal:
        log.info("%s: no %s/ copy: %s", run_dir, PEFT_DIR, refusal)
    return written


def _cloze_peft(kind: str, cfg, tensors: dict[str, torch.Tensor]):
    """objective=cloze: PEFT's copy is the method on the model's `*ForMaskedLM` as it is (no task type, no
    modules_to_save), which scores the label words as the run did where the head stayed frozen. A trained head (the
    label words' decoder rows apart from the tied word embeddings) has no PEFT form: (None, why, tensors)."""
    if cfg.method.head != "frozen":
        return None, (f"objective=cloze with method.head={cfg.method.head}: its label words' decoder rows trained apart "
                      f"from the tied word embeddings, which PEFT cannot hold (weights.safetensors has them: "
                      f"label_words.*)"), tensors
    return kind, None, {name: tensor for name, tensor in tensors.items() if not name.startswith("label_words.")}


def _for_masked_lm(folder: Path) -> None:
    """The exported adapter_config.json for `AutoModelForMaskedLM`: no task type (PEFT has none for a masked LM) and
    no modules_to_save (the head is the checkpoint's own)."""
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(task_type=None, modules_to_save=None)
    write_file(path, json.dumps(config, indent=2) + "\n", TEMPORARY)


def other_pooling(cfg, arch, model_config) -> str | None:
    """Why a PEFT copy of the run would not be the run, where its head reads another pooling than the one PEFT's
    SEQ_CLS model (the architecture's own `*ForSequenceClassification`) pools (objective.pooling, docs/saving.md);
    None where it reads that one."""
    from .architectures import head_pooling
    from .objectives import resolved

    node = resolved(cfg, strict=True) or {}
    kind = node.get("pooling", "head")
    if kind == "head" or kind == head_pooling(arch, model_config):
        return None
    return (f"objective.pooling={kind}: PEFT's SEQ_CLS model pools as {arch.name}'s own head does "
            f"({head_pooling(arch, model_config)}); weights.safetensors holds the run (peltbench.load_run)")


def peft_kind(method, arch) -> tuple[str | None, str | None]:
    """(PEFT's peft_type for this run's copy, None) where PEFT can load the method on this encoder as it is: a method
    of one component, ungated, whose declaration names its PEFT form (`peft`), unless its module refuses this run
    (`peft_refusal(method, arch)`: why not); else (None, why not), the reason None for a method PEFT has no single
    config for (mixtures, adapters ...)."""
    components = [str(name) for name in method.components]
    if method.get("gated", False) or len(components) != 1:
        return None, None
    [name] = components
    module = component(name)
    refusal = module.peft_refusal(method, arch) if hasattr(module, "peft_refusal") else None
    if refusal:
        return None, refusal
    peft = declaration(name).peft
    return (None, None) if peft is None else (peft.type, None)


def export_own(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """A run of a component that says its PEFT form itself (its module's `peft_export(tensors, method, arch)`: RoAd,
    DeLoRA, FourierFT, C3A, a user's), with the head as modules_to_save, for the run's model."""
    [name] = cfg.method.components
    config, renamed = component(str(name)).peft_export(tensors, cfg.method, arch)
    config.update({"task_type": "SEQ_CLS", "modules_to_save": _modules_to_save(arch), "inference_mode": True,
                   "base_model_name_or_path": str(cfg.model.name)})
    return _write_peft(folder, config, renamed)


def _modules_to_save(arch) -> list[str]:
    """The head's new layers, which PEFT's SEQ_CLS keeps whole (`modules_to_save`)."""
    return list(dict.fromkeys(path.split(".")[0] for path in (arch.head.dense, arch.head.out) if path))


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, its metadata's keys then put in sorted order: safetensors writes them in the order of a
    Rust hash map, which differs from one write to the next, and a saved run should compare byte for byte."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    if not metadata:
        return
    with open(path, "r+b") as file:
        size = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(size))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))  # keeps its place, first
        ordered = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(ordered) > size:  # JSON written otherwise than safetensors' (a future version): not in place
            data = file.read()
            padded = ordered + b" " * (-len(ordered) % 8)
            file.seek(0)
            file.write(len(padded).to_bytes(8, "little") + padded + data)
            file.truncate()
            return
        file.seek(8)
        file.write(ordered.ljust(size))  # the same length: safetensors pads its header with spaces


def _write_peft(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}
    write_file(folder / "adapter_config.json", json.dumps(config, indent=2) + "\n", TEMPORARY)
    write_with(folder / "adapter_model.safetensors", lambda path: save_safetensors(tensors, path), TEMPORARY)
    return [f"{PEFT_DIR}/adapter_config.json", f"{PEFT_DIR}/adapter_model.safetensors"]


def export_rotation(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """An OFT, HRA or BOFT run in PEFT's format: our tensors are PEFT's, under PEFT's names (OFT
    `...query.oft_R.weight`, HRA `...query.hra_u`, BOFT `...query.boft_R` and `...query.boft_s`), on each Linear computing a target (ModernBERT: Wqkv, whose input q, k and v share)."""
    [name] = cfg.method.components
    kind = component(str(name))
    targets = cfg.method[f"{name}_targets"]
    config = {
        **kind.peft_config(cfg.method), "task_type": "SEQ_CLS", "bias": "none", "init_weights": True,
        "target_modules": list(dict.fromkeys(arch.projections[t][0] for t in ("query", "key", "value") if t in targets)),
        "modules_to_save": _modules_to_save(arch), "inference_mode": True, "peft_version": PEFT_FORMULAS,
        "base_model_name_or_path": str(cfg.model.name),
    }
    names = {f".{kind.PARAMETER}.weight": f".{kind.PEFT_TENSOR}", f".{kind.PARAMETER}.scale": f".{getattr(kind, 'OUTPUT_SCALE', '')}"}
    renamed = {}
    for name, tensor in tensors.items():
        for ours, theirs in names.items():
            name = name.replace(ours, theirs)
        renamed[f"base_model.model.{name}"] = tensor
    return _write_peft(folder, config, renamed)


def export_peft_adalora(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """An AdaLoRA run in PEFT's format, its final masks as PEFT's `rank_pattern` (a triplet is kept where Λ ≠ 0; PEFT
    drops the others on loading). The schedule fields are placeholders: the export is for inference."""
    method = cfg.method
    modules = [name.removesuffix(".lora_E") for name in tensors if name.endswith(".lora_E")]
    pattern = {f"{module}.lora_E": (tensors[f"{module}.lora_E"].view(-1) != 0).tolist() for module in modules}
    renamed = {}
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        kept = torch.tensor(pattern.get(f"{module}.lora_E", []), dtype=torch.bool)
        if kind in ("lora_A", "lora_E"):
            tensor = tensor[kept]
        elif kind == "lora_B":
            tensor = tensor[:, kept]
        renamed[f"base_model.model.{name}"] = tensor.contiguous()
    config = {
        "peft_type": "ADALORA", "task_type": "SEQ_CLS", "init_r": int(method.adalora_init_rank),
        "target_r": int(method.adalora_target_rank), "lora_alpha": float(method.adalora_alpha), "lora_dropout": 0.0,
        "target_modules": modules, "rank_pattern": pattern, "total_step": 1, "tinit": 0, "tfinal": 0,
        "deltaT": int(method.adalora_delta_t), "beta1": float(method.adalora_beta1),
        "beta2": float(method.adalora_beta2), "orth_reg_weight": float(method.adalora_orth_reg), "bias": "none",
        "modules_to_save": _modules_to_save(arch), "fan_in_fan_out": False, "init_lora_weights": True,
        "inference_mode": True, "base_model_name_or_path": str(cfg.model.name),
    }
    return _write_peft(folder, config, renamed)


def export_peft(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """A LoRA run (LoRA-FA: its frozen A from `tensors` too; DoRA: use_dora and its m) or a VeRA run in PEFT's format:
    adapter_config.json + adapter_model.safetensors (the head as modules_to_save). A PiSSA / OLoRA run: the rank-2r
    LoRA (DoRA) on the original W that PEFT converts such a run to (_principal_as_lora).

    Our y = W x + s · B(A x) is PEFT's LoRA with lora_alpha = s · r (scaling = lora_alpha / r) and no dropout. On a
    fused projection (ModernBERT's Wqkv) PEFT can only adapt the whole Linear: LoRA on its q and v blocks is exported
    exactly as one LoRA of rank 2r on Wqkv, A = [A_q; A_v] and B zero but for B_q in the q rows and B_v in the v rows;
    DoRA's m there is ‖W‖ in the k rows (scale 1: B is zero there) and ours in the q and v rows.
    """
    folder.mkdir(parents=True, exist_ok=True)
    method = cfg.method
    tensors, doubled = _principal_as_lora(tensors)
    targets = [target for target in ("query", "key", "value") if target in method.lora_targets]
    modules = list(dict.fromkeys(arch.projections[target][0] for target in targets))
    fused = any(arch.projections[target][1] is not None for target in targets)
    rank = int(method.lora_rank) * (2 if doubled else 1) * (len(targets) if fused else 1)
    config = {
        "peft_type": "LORA", "task_type": "SEQ_CLS", "r": rank, "lora_alpha": float(method.lora_scale) * rank,
        "lora_dropout": 0.0, "target_modules": modules, "bias": "none",
        "modules_to_save": _modules_to_save(arch),
        "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
        "base_model_name_or_path": str(cfg.model.name),
    }
    config.update(declaration(str(method.components[0])).peft.config)  # DoRA: use_dora
    renamed, blocks, magnitudes = {}, {}, {}
    for name, tensor in tensors.items():
        parts = name.split(".")
        if parts[-2:-1] in (["lora_a"], ["lora_b"]) and parts[-3] in arch.projections and \
                arch.projections[parts[-3]][1] is not None:  # a block of a fused projection: combined below
            blocks.setdefault(".".join(parts[:-3]), {})[(parts[-3], parts[-2])] = tensor
            continue
        if parts[-1] == "magnitude" and arch.projections.get(parts[-2], (None, None))[1] is not None:
            magnitudes.setdefault(".".join(parts[:-2]), {})[parts[-2]] = tensor  # DoRA's m of a block: below
            continue
        name = name.replace(".lora_a.weight", ".lora_A.weight").replace(".lora_b.weight", ".lora_B.weight")
        name = name.replace(".magnitude", ".lora_magnitude_vector")  # DoRA's m
        renamed[f"base_model.model.{name}"] = tensor
    for module, parts in blocks.items():
        a, b = _fused_lora(parts, targets, arch)
        renamed[f"base_model.model.{module}.lora_A.weight"] = a
        renamed[f"base_model.model.{module}.lora_B.weight"] = b
    for module, parts in magnitudes.items():  # the fused projection's m: ‖W‖ (dora.frozen_state) but in our blocks
        full = tensors[f"{module}.lora_magnitude_vector"].clone()
        size = full.shape[0] // len(arch.projections)
        for target, magnitude in parts.items():
            block = arch.projections[target][1]
            full[block * size : (block + 1) * size] = magnitude
        renamed[f"base_model.model.{module}.lora_magnitude_vector"] = full
    return _write_peft(folder, config, renamed)


def _principal_as_lora(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], bool]:
    """A PiSSA / OLoRA run (its frozen A₀, B₀ among `tensors`) as the LoRA of rank 2r that PEFT's
    `path_initial_model_for_weight_conversion` writes, which loads on the original W: s·(BA − B₀A₀) = s·B'A' with
    A' = [A; A₀], B' = [B, −B₀] (the scale is kept: lora_alpha doubles with r). Returns (tensors, whether converted)."""
    initial = [name.removesuffix(".lora_a0") for name in tensors if name.endswith(".lora_a0")]
    if not initial:
        return tensors, False
    converted = {name: tensor for name, tensor in tensors.items() if not name.endswith((".lora_a0", ".lora_b0"))}
    for module in initial:
        converted[f"{module}.lora_a.weight"] = torch.cat([tensors[f"{module}.lora_a.weight"], tensors[f"{module}.lora_a0"]])
        converted[f"{module}.lora_b.weight"] = torch.cat([tensors[f"{module}.lora_b.weight"], -tensors[f"{module}.lora_b0"]],
                                                         dim=1)
    return converted, True


def export_vera(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """A VeRA run in PEFT's format (its A and B among `tensors`: methods.member_frozen)."""
    return _write_peft(folder, *_vera_export(tensors, cfg, arch))


def _vera_export(tensors: dict[str, torch.Tensor], cfg, arch) -> tuple[dict, dict[str, torch.Tensor]]:
    """A VeRA run as PEFT's VeraConfig with save_projection (its A and B kept, at PEFT's names vera_A, vera_B) and the
    model seed as projection_prng_key, from which PEFT would draw the same A and B (tests/test_vera.py)."""
    method = cfg.method
    modules = list(dict.fromkeys(arch.projections[t][0] for t in ("query", "key", "value") if t in method.vera_targets))
    config = {
        "peft_type": "VERA", "task_type": "SEQ_CLS", "r": int(method.vera_rank), "target_modules": modules,
        "projection_prng_key": int(cfg.model_seed), "save_projection": True, "vera_dropout": 0.0,
        "d_initial": float(method.vera_d_initial), "bias": "none", "modules_to_save": _modules_to_save(arch),
        "fan_in_fan_out": False, "init_weights": True, "inference_mode": True,
        "base_model_name_or_path": str(cfg.model.name),
    }
    renamed = {(f"base_model.{name}" if name in ("vera_A", "vera_B") else f"base_model.model.{name}"): tensor
               for name, tensor in tensors.items()}
    return config, renamed


def export_ia3(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """An (IA)³ run as PEFT's IA3: every scaled module named in full (PEFT matches a listed name as a suffix, and
    `output.dense` would also catch attention.output.dense); the FFN's as `feedforward_modules` (scaling the input).
    ModernBERT's key and value vectors scale row blocks of Wqkv: exported as one vector on Wqkv, 1 on the query rows."""
    renamed, blocks, targets, feedforward = {}, {}, [], []
    for name, tensor in tensors.items():
        if not name.endswith(".ia3_l"):
            renamed[f"base_model.model.{name}"] = tensor
            continue
        module = name.removesuffix(".ia3_l")
        parent, _, target = module.rpartition(".")
        if target in arch.projections and arch.projections[target][1] is not None:  # a block of a fused projection
            blocks.setdefault(parent, {})[arch.projections[target][1]] = tensor
            continue
        ffn = module.endswith(f".{arch.ffn}.{arch.ffn_linear}")
        targets.append(module)
        feedforward += [module] if ffn else []
        renamed[f"base_model.model.{name}"] = tensor.view(1, -1) if ffn else tensor.view(-1, 1)
    for module, parts in blocks.items():
        size = next(iter(parts.values())).numel()
        vector = torch.cat([parts.get(block, torch.ones(size)) for block in range(len(arch.projections))])
        targets.append(module)
        renamed[f"base_model.model.{module}.ia3_l"] = vector.view(-1, 1)
    config = {"peft_type": "IA3", "task_type": "SEQ_CLS", "target_modules": sorted(targets),
              "feedforward_modules": sorted(feedforward), "modules_to_save": _modules_to_save(arch), "fan_in_fan_out": False,
              "init_ia3_weights": True, "inference_mode": True, "base_model_name_or_path": str(cfg.model.name)}
    return _write_peft(folder, config, renamed)


def export_prompt(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """A prompt-tuning run as PEFT's PROMPT_TUNING: its P × E prompts as `prompt_embeddings`, the head beside."""
    prompts = tensors["prompt.embedding"]  # PEFT reads the model's heads and layers from its own config
    config = {"peft_type": "PROMPT_TUNING", "task_type": "SEQ_CLS", "num_virtual_tokens": prompts.shape[0],
              "token_dim": prompts.shape[1], "num_transformer_submodules": 1, "prompt_tuning_init": "RANDOM", "modules_to_save": _modules_to_save(arch), "inference_mode": True,
              "base_model_name_or_path": str(cfg.model.name)}
    renamed = {("prompt_embeddings" if name == "prompt.embedding" else f"base_model.{name}"): tensor
               for name, tensor in tensors.items()}
    return _write_peft(folder, config, renamed)


def _fused_lora(parts: dict, targets: list[str], arch) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank-(n·r) LoRA on a fused projection from the n rank-r LoRAs on its blocks (see export_peft)."""
    a = torch.cat([parts[(target, "lora_a")] for target in targets])
    size, rank = parts[(targets[0], "lora_b")].shape
    b = torch.zeros(size * len(arch.projections), rank * len(targets), dtype=a.dtype)
    for i, target in enumerate(targets):
        block = arch.projections[target][1]
        b[block * size : (block + 1) * size, i * rank : (i + 1) * rank] = parts[(target, "lora_b")]
    return a.contiguous(), b


# How each PEFT form is written (a component's declaration names its form: `peft=Peft("LORA")`), and the forms that
# need what a member keeps frozen beside what it trains (LoRA-FA's A, PiSSA's A₀ and B₀, VeRA's A and B).
EXPORTS = {"LORA": export_peft, "VERA": export_vera, "ADALORA": export_peft_adalora, "OFT": export_rotation,
           "HRA": export_rotation, "BOFT": export_rotation, "IA3": export_ia3, "PROMPT_TUNING": export_prompt}
WITH_FROZEN = ("LORA", "VERA")


def save_predictions(run_dir: Path, predictions: np.ndarray, labels: np.ndarray, task,
                     logits: np.ndarray | None = None, rows=None) -> str:
    """predictions.csv: index (row of the official dev split), label, prediction (a class id, or the STS-B score),
    and for a classification task logit_0 ... logit_{C-1}, the head's outputs whose largest is the prediction (their
    softmax is the model's probabilities: calibration and paired tests need no retraining). Logits are written with
    9 significant digits, which round-trips a float32. `rows`: the official dev rows scored, when the test set is a
    part of it (protocol full_halves); default all."""
    rows = range(len(labels)) if rows is None else [int(row) for row in rows]

    def write(path: Path) -> None:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            classes = 0 if task.is_regression or logits is None else logits.shape[1]
            writer.writerow(["index", "label", "prediction", *(f"logit_{c}" for c in range(classes))])
            for position, (index, label, predicted) in enumerate(zip(rows, labels.tolist(), predictions.tolist())):
                if task.is_regression:
                    writer.writerow([index, f"{label:.6g}", f"{predicted:.6g}"])
                else:
                    outputs = logits[position].tolist() if classes else []
                    writer.writerow([index, int(label), int(predicted), *(f"{value:.9g}" for value in outputs)])
    write_with(run_dir / PREDICTIONS, write, TEMPORARY)
    return PREDICTIONS


def read_weights(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a run's weights.safetensors and its metadata; a UserError naming the file if there is none or
    it is not a whole safetensors file (cut short by a full disk or a partial copy, empty, something else)."""
    from safetensors import SafetensorError, safe_open

    path = Path(run_dir) / WEIGHTS
    if not path.is_file():
        raise UserError(f"{path}: no such file (the run keeps its weights with save.weights=true)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"{path}: not a readable safetensors file, cut short or empty? ({reason})") from None
    return tensors, metadata


def check_owner(path: Path, metadata: dict[str, str], record: dict) -> None:
    """A UserError naming `path` unless it holds the weights of the run whose record is `record`: the config hash in
    its metadata (the method's settings in files written before the hash was) is the record's."""
    saved, own = metadata.get("config_hash"), record.get("config_hash")
    if saved is None:
        try:
            saved, own = json.loads(metadata["method"]), record["config"]["method"]
        except (KeyError, TypeError, ValueError):
            return  # written by something else: its tensors decide (check_shapes)
    if saved != own:
        try:
            method = json.loads(metadata["method"])["name"]
        except (KeyError, TypeError, ValueError):
            method = "another method"
        raise UserError(f"{path}: the weights of another run (of {method}), not of this record's "
                        f"{record.get('variant')}/{record.get('task')}/k{record.get('k')}/seed{record.get('seed')}")


def check_shapes(path: Path, tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> None:
    """A UserError naming `path` unless it holds exactly the tensors, by name and shape, of `shapes` (the model's)."""
    wrong = [f"{name} has shape {tuple(tensors[name].shape)}, the model needs {tuple(shape)}"
             for name, shape in shapes.items() if name in tensors and tuple(tensors[name].shape) != tuple(shape)]
    wrong += [f"it lacks {name}" for name in shapes if name not in tensors]
    wrong += [f"the model has no {name}" for name in tensors if name not in shapes]
    if wrong:
        more = f" and {len(wrong) - 1} more differences" if len(wrong) > 1 else ""
        raise UserError(f"{path}: not this run's weights ({wrong[0]}{more})")
