"""One experiment, end to end: config → data split → model + method → training → result record."""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from . import UserError
from .data import encode, few_shot_split, load_split
from .methods import build_pelt_model, check_method, parameter_counts
from .model import load_backbone, load_tokenizer
from .claim import claim_run, describe, live_claim
from .record import (SCHEMA, check_existing, config_hash, machine, model_identity, probe_writable, record_path, utc_now,
                     variant_name, versions, write_record)
from .tasks import TaskSpec
from .train import Evaluator, TrainSettings, fit

log = logging.getLogger("peltbench")


def run_experiment(cfg: DictConfig, results_dir: Path) -> dict:
    """Run one config and write its record, or return the finished record of an identical earlier run.

    A UserError (bad config or input) writes no record. Any other failure writes a `failed` record,
    which a later identical run retries, and is raised again. A run that another live process is training
    (peltbench.claim) is not run: the result is {"status": "running"}.
    """
    check_config(cfg)
    path = record_path(cfg, results_dir)
    finished = check_existing(path, cfg)
    if finished is None:
        probe_writable(path)  # an unwritable results_dir or a full disk is found now, not after training
        claim = claim_run(path)
        if claim is None:  # another process is training it; its record will appear
            log.info("skip: %s is being run by another process (%s)", path.parent, describe(live_claim(path) or {}))
            return {"status": "running"}
        with claim:
            finished = check_existing(path, cfg)  # written by the process that held the claim until just now?
            if finished is None:
                return _run_claimed(cfg, path)
    log.info("skip: %s is already done (test %s %s)", path.parent, cfg.task.main_metric, finished["test"]["main"])
    return finished


def _run_claimed(cfg: DictConfig, path: Path) -> dict:
    digest = config_hash(cfg)
    log.info("run: %s", path.parent)
    record = _identity(cfg, digest)
    try:
        record.update(_train_and_test(cfg))
        record["status"] = "ok"
    except UserError:
        raise
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0],
                      traceback=traceback.format_exc(), test=None, dev_best=None)
        write_record(path, {**record, "finished_at": utc_now()})
        log.error("failed: %s (record written to %s)", record["error"], path)
        raise
    write_record(path, {**record, "finished_at": utc_now()})
    log.info("done: test %s %s, record %s", cfg.task.main_metric, record["test"]["main"], path)
    return record


def check_config(cfg: DictConfig) -> None:
    """The checks Hydra cannot make: k, seeds and sizes, device and precision."""
    if not (cfg.k == "all" or (isinstance(cfg.k, int) and cfg.k > 0)):
        raise UserError(f"k={cfg.k}: must be a positive number of training examples (100, 500, 1000) or 'all'")
    for key in ("seed", "model_seed", "dev_size"):
        if not isinstance(cfg[key], int) or cfg[key] < 0:
            raise UserError(f"{key}={cfg[key]}: must be a non-negative integer")
    for key in ("epochs", "patience", "batch_size", "max_length", "eval_batch_size"):
        if not isinstance(cfg.train[key], int) or cfg.train[key] < 1:
            raise UserError(f"train.{key}={cfg.train[key]}: must be a positive integer")
    if cfg.precision not in ("auto", "bf16", "fp32"):
        raise UserError(f"precision={cfg.precision}: must be auto, bf16 or fp32")
    try:
        check_method(cfg.method)
    except ValueError as error:
        raise UserError(str(error)) from None


def _identity(cfg: DictConfig, digest: str) -> dict:
    return {
        "schema": SCHEMA, "method": cfg.method.name, "variant": variant_name(cfg), "task": cfg.task.name,
        "k": cfg.k, "seed": cfg.seed, "model_seed": cfg.model_seed, "model": model_identity(cfg.model.name),
        "status": None, "error": None,
        "config": OmegaConf.to_container(cfg, resolve=True), "config_hash": digest,
        "versions": versions(), "started_at": utc_now(),
    }


def resolve_device(cfg: DictConfig) -> tuple[torch.device, bool]:
    """The device, and whether to autocast to bf16 (CUDA with bf16 support, unless precision says otherwise)."""
    name = cfg.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"device={cfg.device}: not a device (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={cfg.device}: CUDA is not available on this machine")
    if cfg.precision == "auto":
        return device, device.type == "cuda" and torch.cuda.is_bf16_supported()
    return device, cfg.precision == "bf16"


def use_allocated_cpus() -> None:
    """Under SLURM, use the CPUs the job was given, not every core of the node: jobs sharing a node would
    otherwise oversubscribe it, and PyTorch's thread pools slow down badly when they do."""
    allocated = os.environ.get("SLURM_CPUS_PER_TASK")
    if allocated and allocated.isdigit() and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(int(allocated))


def _train_and_test(cfg: DictConfig) -> dict:
    use_allocated_cpus()
    task = TaskSpec.from_config(cfg.task)
    data_dir = None if cfg.data.dir is None else str(cfg.data.dir)
    train_split = load_split(task, data_dir, "train")
    test_split = load_split(task, data_dir, "test")
    if cfg.k == "all":  # Table 3: all of train; select and report on the official dev split
        train_rows, dev_rows, dev_split = np.arange(len(train_split)), np.arange(len(test_split)), test_split
    else:
        train_rows, dev_rows = few_shot_split(len(train_split), cfg.k, cfg.seed, cfg.dev_size)
        dev_split = train_split
    device, bf16 = resolve_device(cfg)

    tokenizer = load_tokenizer(cfg.model.name)
    backbone = load_backbone(cfg.model.name, task.num_labels, cfg.model_seed)
    model = build_pelt_model(backbone, cfg.method, cfg.model_seed).to(device)
    counts = parameter_counts(model)
    log.info("%s on %s: %s trainable parameters stored per task (%s in the optimiser), %s, %s",
             cfg.method.name, task.name, f"{counts['trainable_params']:,}", f"{counts['optimizer_params']:,}",
             device, "bf16" if bf16 else "fp32")

    settings = TrainSettings(
        lr=cfg.method.lr, epochs=cfg.train.epochs, patience=cfg.train.patience, batch_size=cfg.train.batch_size,
        grad_clip=cfg.train.grad_clip, eval_batch_size=cfg.train.eval_batch_size, seed=cfg.model_seed,
        device=device, bf16=bf16,
    )
    length, pad = cfg.train.max_length, tokenizer.pad_token_id
    train = encode(train_split, train_rows, tokenizer, length)
    dev = Evaluator(encode(dev_split, dev_rows, tokenizer, length), task, settings, pad)
    test = Evaluator(encode(test_split, np.arange(len(test_split)), tokenizer, length), task, settings, pad)

    result = fit(model, train, dev, task, settings, pad)
    model.context.start_gate_recording()
    test_scores = test(model)
    gates = model.context.stop_gate_recording()
    log.info("test %s", ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a" for k, v in test_scores.items()))
    return {
        "test": test_scores, "dev_best": result.dev_best, "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run, "history": result.history, **counts,
        "train_seconds": round(result.train_seconds, 3), "train_steps": result.train_steps,
        "eval_seconds": round(result.eval_seconds + test.seconds, 3), "test_seconds": round(test.seconds, 3),
        "test_examples": len(test_split), "gates": gates,
        "split": {
            "train_indices": None if cfg.k == "all" else train_rows.tolist(),
            "dev_indices": None if cfg.k == "all" else dev_rows.tolist(),
        },
        "device": str(device), "machine": machine(device), "precision": "bf16" if bf16 else "fp32",
        "data_source": train_split.source,
    }
