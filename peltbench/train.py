"""The training loop: AdamW, linear decay, dev evaluation every epoch, early stopping (App. B, METHODS.md).

A plain PyTorch loop, read top to bottom. The best trainable state is kept in memory (no checkpoint
files) and restored before the one test evaluation.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import Encoded, collate, evaluation_batches
from .metrics import compute_metrics
from .tasks import TaskSpec

log = logging.getLogger("peltbench")


@dataclass
class TrainSettings:
    lr: float
    epochs: int = 50
    patience: int = 10
    batch_size: int = 16
    grad_clip: float = 1.0
    eval_batch_size: int = 128
    seed: int = 42
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    bf16: bool = False


@dataclass
class TrainResult:
    best_epoch: int
    epochs_run: int
    dev_best: dict
    history: list[dict]
    train_seconds: float
    train_steps: int
    eval_seconds: float


class Evaluator:
    """Scores one evaluation set; its padded, length-sorted batches are built once and stay on the device."""

    def __init__(self, encoded: Encoded, task: TaskSpec, settings: TrainSettings, pad_id: int) -> None:
        self.batches = evaluation_batches(encoded, settings.eval_batch_size, pad_id, settings.device)
        self.order = [row for rows, _ in self.batches for row in rows]
        self.labels = encoded.labels
        self.task = task
        self.settings = settings
        self.seconds = 0.0  # wall time of the last call

    @torch.inference_mode()
    def __call__(self, model) -> dict:
        start = _now(self.settings.device)
        model.eval()
        logits = []
        for _, batch in self.batches:
            with _autocast(self.settings):
                logits.append(model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).float())
        outputs = np.empty((len(self.labels), model.backbone.config.num_labels), dtype=np.float32)
        outputs[self.order] = torch.cat(logits).cpu().numpy()  # one device-to-host copy, back in row order
        predictions = outputs[:, 0] if self.task.is_regression else outputs.argmax(axis=1)
        self.seconds = _now(self.settings.device) - start
        return compute_metrics(self.task.metrics, self.task.main_metric, predictions, self.labels)


def fit(model, train: Encoded, dev: Evaluator, task: TaskSpec, settings: TrainSettings, pad_id: int) -> TrainResult:
    """Train with early stopping on the dev set's main metric; leave the model in its best state."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    steps_per_epoch = math.ceil(len(train) / settings.batch_size)
    total_steps = settings.epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(
        parameters, lr=settings.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
        fused=settings.device.type == "cuda",
    )
    # Hugging Face's linear schedule with no warm-up: from lr down to 0 over the planned epochs.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, (total_steps - step) / total_steps))
    shuffler = torch.Generator().manual_seed(settings.seed)
    torch.manual_seed(settings.seed)  # dropout

    best_score, best_epoch, best_state, dev_best = -math.inf, 0, None, {}
    history: list[dict] = []
    train_seconds = eval_seconds = 0.0
    steps = 0
    for epoch in range(1, settings.epochs + 1):
        start = _now(settings.device)
        loss = _train_epoch(model, train, task, settings, optimizer, schedule, parameters, shuffler, pad_id)
        train_seconds += _now(settings.device) - start
        steps += steps_per_epoch
        scores = dev(model)
        eval_seconds += dev.seconds
        score = scores["main"] if scores["main"] is not None else -math.inf
        history.append({"epoch": epoch, "train_loss": loss, "dev_main": scores["main"]})
        if best_state is None or score > best_score:  # strict improvement only (HF EarlyStoppingCallback)
            best_score, best_epoch, dev_best = score, epoch, scores
            best_state = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        log.info(
            "epoch %d/%d  loss %.4f  dev %s %s  (best %s at epoch %d)  %.1fs",
            epoch, settings.epochs, loss, task.main_metric, _fmt(scores["main"]), _fmt(dev_best["main"]),
            best_epoch, _now(settings.device) - start,
        )
        if epoch - best_epoch >= settings.patience:
            log.info("early stopping: no improvement in %d evaluations", settings.patience)
            break
    _restore(model, best_state)
    return TrainResult(best_epoch, epoch, dev_best, history, train_seconds, steps, eval_seconds)


def _train_epoch(model, train, task, settings, optimizer, schedule, parameters, shuffler, pad_id) -> float:
    model.train()
    order = torch.randperm(len(train), generator=shuffler).tolist()
    total, count = 0.0, 0
    starts = range(0, len(order), settings.batch_size)
    # A bar within the epoch for long epochs (k=all) on a terminal; off in logs and batch jobs (disable=None).
    for start in tqdm(starts, desc="train", unit="step", leave=False, disable=None, mininterval=2):
        batch = collate(train, order[start : start + settings.batch_size], pad_id, settings.device)
        with _autocast(settings):
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = _loss(logits.float(), batch["labels"], task)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, settings.grad_clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        total += loss.detach() * len(batch["labels"])
        count += len(batch["labels"])
    return float(total) / count


def _loss(logits: torch.Tensor, labels: torch.Tensor, task: TaskSpec) -> torch.Tensor:
    if task.is_regression:
        return F.mse_loss(logits.squeeze(-1), labels)
    return F.cross_entropy(logits, labels)


@torch.no_grad()
def _restore(model, state: dict) -> None:
    for name, parameter in model.named_parameters():
        if name in state:
            parameter.copy_(state[name])


def _autocast(settings: TrainSettings):
    if settings.bf16:
        return torch.autocast(device_type=settings.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _now(device: torch.device) -> float:
    """Wall time, after the device has finished the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _fmt(score) -> str:
    return "n/a" if score is None or score == -math.inf else f"{score:.2f}"
