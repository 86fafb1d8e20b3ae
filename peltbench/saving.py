"""What a run may keep beside its result.json: its trained tensors, its test predictions, a PEFT copy of a LoRA.

    save.weights=true       weights.safetensors: what the method trains (PELT modules, gates; for fine-tuning the
                            whole model) and the head, each tensor at the run's own size, under the plain Hugging Face model's
                            names (`bert.encoder.layer.3.output.LayerNorm.weight`, `...output.adapter.down.weight`,
                            `classifier.weight`); its metadata names the method, model and task. A plain LoRA run
                            (ungated, nothing else) also writes peft/, which `PeftModel.from_pretrained` loads.
    save.predictions=true   predictions.csv: one row per test example, in the official dev split's order.

`peltbench.load_run(run_dir)` (runner.py) rebuilds a saved run on its backbone.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .methods import member_head, member_shapes, member_state

WEIGHTS = "weights.safetensors"
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
                "method": json.dumps(OmegaConf.to_container(cfg.method, resolve=True))}
    _atomic(run_dir / WEIGHTS, lambda path: save_file(tensors, str(path), metadata=metadata))
    written = [WEIGHTS]
    if list(cfg.method.components) == ["lora"] and not cfg.method.get("gated", False):
        written += export_peft(run_dir / PEFT_DIR, tensors, cfg, arch)
    return written


def export_peft(folder: Path, tensors: dict[str, torch.Tensor], cfg, arch) -> list[str]:
    """A LoRA run in PEFT's format: adapter_config.json + adapter_model.safetensors (the head as modules_to_save).

    Our y = W x + s · B(A x) is PEFT's LoRA with lora_alpha = s · r (scaling = lora_alpha / r) and no dropout. On a
    fused projection (ModernBERT's Wqkv) PEFT can only adapt the whole Linear: LoRA on its q and v blocks is exported
    exactly as one LoRA of rank 2r on Wqkv, A = [A_q; A_v] and B zero but for B_q in the q rows and B_v in the v rows.
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    method = cfg.method
    targets = [target for target in ("query", "key", "value") if target in method.lora_targets]
    modules = list(dict.fromkeys(arch.projections[target][0] for target in targets))
    fused = any(arch.projections[target][1] is not None for target in targets)
    rank = int(method.lora_rank) * (len(targets) if fused else 1)
    config = {
        "peft_type": "LORA", "task_type": "SEQ_CLS", "r": rank, "lora_alpha": float(method.lora_scale) * rank,
        "lora_dropout": 0.0, "target_modules": modules, "bias": "none",
        "modules_to_save": list(dict.fromkeys(path.split(".")[0] for path in (arch.head.dense, arch.head.out) if path)),
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
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    _atomic(folder / "adapter_model.safetensors", lambda path: save_file(renamed, str(path)))
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
    _atomic(run_dir / PREDICTIONS, write)
    return PREDICTIONS


def read_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / WEIGHTS))


def _atomic(path: Path, write) -> None:
    """Write through a temporary file and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
