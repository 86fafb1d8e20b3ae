"""What a run may keep beside its result.json: its trained tensors, its test predictions, a PEFT copy of a LoRA.

    save.weights=true       weights.safetensors: what the method trains (PELT modules, gates; for fine-tuning the
                            whole model) and the head, each tensor at the run's own size, under the plain Hugging Face model's
                            names (`bert.encoder.layer.3.output.LayerNorm.weight`, `...output.adapter.down.weight`,
                            `classifier.weight`); its metadata names the method, model and task. A plain LoRA, (IA)³
                            or prompt-tuning run (ungated, nothing else) also writes peft/, which
                            `PeftModel.from_pretrained` loads; a prefix run says in one log line why it does not.
    save.predictions=true   predictions.csv: one row per test example, in the official dev split's order.

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
from .files import write_file, write_with
from .methods import member_head, member_shapes, member_state
from .record import config_hash

log = logging.getLogger("peltbench")

WEIGHTS = "weights.safetensors"
TEMPORARY = ".save."  # files.TEMPORARY_PREFIXES: what a killed run leaves is removed by the next run of the record
PREDICTIONS = "predictions.csv"
PEFT_DIR = "peft"


def member_weights(model, slot: int, method, config) -> dict[str, torch.Tensor]:
    """Member `slot`'s trained tensors, each cut to the member's own size (a group pads smaller members), and its
    head even where the method leaves it frozen at its random init (prefix, LoRA): a copy needs it."""
    state = member_state(model, slot)
    tensors = {name: state[name][tuple(slice(0, n) for n in shape)].contiguous().cpu()
               for name, shape in member_shapes(method, config).items()}
    tensors.update({name: tensor.cpu() for name, tensor in member_head(model, slot).items()})
    return tensors


def save_weights(run_dir: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """weights.safetensors (and peft/ for a plain LoRA run); the files written, relative to run_dir."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_file

    metadata = {"peltbench": __version__, "model": str(cfg.model.name), "task": cfg.task.name,
                "method": json.dumps(OmegaConf.to_container(cfg.method, resolve=True)), "config_hash": config_hash(cfg)}
    write_with(run_dir / WEIGHTS, lambda path: save_file(tensors, str(path), metadata=metadata), TEMPORARY)
    written = [WEIGHTS]
    exporter = peft_exporter(cfg.method)
    if exporter is not None:
        written += exporter(run_dir / PEFT_DIR, tensors, cfg, arch)
    elif list(cfg.method.components) == ["prefix"]:
        log.info("%s: no %s/ copy: %s", run_dir, PEFT_DIR, NO_PEFT_PREFIX)
    return written


# PEFT's prefix tuning numbers the tokens after the L prefix positions (it passes past_key_values, and shifts
# position ids it is given), and refuses DeBERTa-v2 and ModernBERT, which take no past_key_values.
NO_PEFT_PREFIX = ("PEFT's prefix tuning shifts every position id by the prefix length (and cannot run on DeBERTa-v2 "
                  "or ModernBERT), so a PEFT copy would not predict what this run does (docs/saving.md)")


def peft_exporter(method):
    """The function that writes a run of `method` in PEFT's format (LoRA, (IA)³, prompt tuning alone, ungated), or
    None where PEFT has no equal method (a mixture, a gate, adapters, BitFit, LN-tuning, prefixes)."""
    if method.get("gated", False) or len(method.components) != 1:
        return None
    return {"lora": export_peft, "ia3": export_ia3, "prompt": export_prompt}.get(method.components[0])


def export_peft(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """A LoRA run in PEFT's format: adapter_config.json + adapter_model.safetensors (the head as modules_to_save).

    Our y = W x + s · B(A x) is PEFT's LoRA with lora_alpha = s · r (scaling = lora_alpha / r) and no dropout. On a
    fused projection (ModernBERT's Wqkv) PEFT can only adapt the whole Linear: LoRA on its q and v blocks is exported
    exactly as one LoRA of rank 2r on Wqkv, A = [A_q; A_v] and B zero but for B_q in the q rows and B_v in the v rows.
    """
    method = cfg.method
    targets = [target for target in ("query", "key", "value") if target in method.lora_targets]
    modules = list(dict.fromkeys(arch.projections[target][0] for target in targets))
    fused = any(arch.projections[target][1] is not None for target in targets)
    rank = int(method.lora_rank) * (len(targets) if fused else 1)
    config = {
        "peft_type": "LORA", "task_type": "SEQ_CLS", "r": rank, "lora_alpha": float(method.lora_scale) * rank,
        "lora_dropout": 0.0, "target_modules": modules, "bias": "none", "modules_to_save": _head_modules(arch),
        "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
        "base_model_name_or_path": str(cfg.model.name),
    }
    renamed, blocks = {}, {}
    for name, tensor in tensors.items():
        parts = name.split(".")
        if parts[-2:-1] in (["lora_a"], ["lora_b"]) and parts[-3] in arch.projections and \
                arch.projections[parts[-3]][1] is not None:  # a block of a fused projection: combined below
            blocks.setdefault(".".join(parts[:-3]), {})[(parts[-3], parts[-2])] = tensor
            continue
        name = name.replace(".lora_a.weight", ".lora_A.weight").replace(".lora_b.weight", ".lora_B.weight")
        renamed[f"base_model.model.{name}"] = tensor
    for module, parts in blocks.items():
        a, b = _fused_lora(parts, targets, arch)
        renamed[f"base_model.model.{module}.lora_A.weight"] = a
        renamed[f"base_model.model.{module}.lora_B.weight"] = b
    return _write_peft(folder, config, renamed)


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
              "feedforward_modules": sorted(feedforward), "modules_to_save": _head_modules(arch), "fan_in_fan_out": False,
              "init_ia3_weights": True, "inference_mode": True, "base_model_name_or_path": str(cfg.model.name)}
    return _write_peft(folder, config, renamed)


def export_prompt(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """A prompt-tuning run as PEFT's PROMPT_TUNING: its P × E prompts as `prompt_embeddings`, the head beside."""
    prompts = tensors["prompt.embedding"]  # PEFT reads the model's heads and layers from its own config
    config = {"peft_type": "PROMPT_TUNING", "task_type": "SEQ_CLS", "num_virtual_tokens": prompts.shape[0],
              "token_dim": prompts.shape[1], "num_transformer_submodules": 1, "prompt_tuning_init": "RANDOM", "modules_to_save": _head_modules(arch), "inference_mode": True,
              "base_model_name_or_path": str(cfg.model.name)}
    renamed = {("prompt_embeddings" if name == "prompt.embedding" else f"base_model.{name}"): tensor
               for name, tensor in tensors.items()}
    return _write_peft(folder, config, renamed)


def _head_modules(arch) -> list[str]:
    """The head's new layers as PEFT's modules_to_save (DeBERTa's pooler too: it is the run's own, not pretrained)."""
    return list(dict.fromkeys(path.split(".")[0] for path in (arch.head.dense, arch.head.out) if path))


def _write_peft(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> list[str]:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}
    write_file(folder / "adapter_config.json", json.dumps(config, indent=2) + "\n", TEMPORARY)
    write_with(folder / "adapter_model.safetensors", lambda path: save_file(tensors, str(path)), TEMPORARY)
    return [f"{PEFT_DIR}/adapter_config.json", f"{PEFT_DIR}/adapter_model.safetensors"]


def _fused_lora(parts: dict, targets: list[str], arch) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank-(n·r) LoRA on a fused projection from the n rank-r LoRAs on its blocks (see export_peft)."""
    a = torch.cat([parts[(target, "lora_a")] for target in targets])
    size, rank = parts[(targets[0], "lora_b")].shape
    b = torch.zeros(size * len(arch.projections), rank * len(targets), dtype=a.dtype)
    for i, target in enumerate(targets):
        block = arch.projections[target][1]
        b[block * size : (block + 1) * size, i * rank : (i + 1) * rank] = parts[(target, "lora_b")]
    return a.contiguous(), b


def save_predictions(run_dir: Path, predictions: np.ndarray, labels: np.ndarray, task) -> str:
    """predictions.csv: index (row of the official dev split), label, prediction (a class id, or the STS-B score)."""
    def write(path: Path) -> None:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["index", "label", "prediction"])
            for index, (label, predicted) in enumerate(zip(labels.tolist(), predictions.tolist())):
                if task.is_regression:
                    writer.writerow([index, f"{label:.6g}", f"{predicted:.6g}"])
                else:
                    writer.writerow([index, int(label), int(predicted)])
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
