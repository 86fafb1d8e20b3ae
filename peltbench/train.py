"""The training loop: AdamW, linear decay, dev evaluation every epoch (or every N steps), early stopping (App. B,
docs/protocol.md; a protocol in steps, e.g. LM-BFF's 1,000 steps with dev every 100: §10).

One loop trains a *group* of runs ("members") that share one frozen backbone; a separate run is a group of
one. Every step concatenates the active members' batches (each member its own data order) into one forward
and one backward. What is per member is visible in the loop: its learning rate and schedule, its own
gradient norm clipping, its dropout masks (keyed by its seeds, step and examples: methods/randomness.py), its dev
score, its early stopping and best state. A member that stops leaves the
group; its best state is restored and its test set scored (with the others that stop at the same epoch),
and the caller hears of it at once (`on_done`), so its record is written while the others go on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields

import numpy as np
import torch
import torch.nn.functional as F

from .data import Encoded, collate_group, collate_host
from .interrupts import step_boundaries, stop, stop_pending
from .methods import (after_step, component_state, load_member_state, member_state, plan_training, regulariser,
                      restore_components)
from .methods.randomness import step_keys
from .metrics import compute_metrics
from .progress import progress
from .tasks import TaskSpec

log = logging.getLogger("peltbench")


@dataclass
class TrainSettings:
    """One member's training settings (App. B)."""

    lr: float
    epochs: int | None = 50
    patience: int | None = 10   # dev evaluations without strict improvement before stopping; None: never early
    grad_clip: float = 1.0
    seed: int = 42       # the model seed: the member's data order and, with the data seed, its dropout masks
    data_seed: int = 0   # the data seed (its dropout masks: methods/randomness.py)
    steps: int | None = None       # train exactly this many steps instead of `epochs` (train.max_steps; then eval_every is set)
    eval_every: int | None = None  # dev every this many steps; None: after every epoch

    def total_steps(self, steps_per_epoch: int) -> int:
        return self.steps if self.steps is not None else self.epochs * steps_per_epoch

    def period(self, steps_per_epoch: int) -> int:
        """Optimiser steps between two dev evaluations."""
        return self.eval_every if self.eval_every is not None else steps_per_epoch


@dataclass
class GroupSettings:
    """What the members of a group share: the backbone's device and precision, and the batch shapes."""

    batch_size: int = 16
    eval_batch_size: int = 128
    pad_id: int = 0
    pad_to: int | None = None  # pad every batch to this width (gate_pooling=padded), else to its longest row
    split_by_length: bool = False  # passes in length-sorted pieces (CPU: pieces, length_cuts)
    members_per_pass: int | None = None  # a training step's forward and backward for this many members at a time
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    bf16: bool = False


@dataclass
class Member:
    """One run of the group: its data, its settings, and what the loop keeps for it."""

    name: str
    train: Encoded
    dev: Encoded
    test: Encoded
    settings: TrainSettings
    history: list[dict] = field(default_factory=list)
    best_score: float = -math.inf
    best_epoch: int = 0
    dev_best: dict = field(default_factory=dict)
    best_state: dict | None = None
    train_seconds: float = 0.0  # the group's: wall time of every training period it was in
    eval_seconds: float = 0.0
    train_seconds_share: float = 0.0  # its part of them: each period's seconds × its share of the rows (`shares`)
    eval_seconds_share: float = 0.0
    steps: int = 0
    error: str | None = None  # why it stopped without a result (a non-finite loss)
    test_rows: np.ndarray | None = None  # the official dev rows of `test` when it is a part of them (full_halves)
    wanted: bool = True  # False: it trains only so that its group computes what it did (a resumed group's done run)

    def reset(self) -> None:
        """Back to before training (MEMBER_PROGRESS at their defaults): a group that could not resume starts over."""
        for item in fields(self):
            if item.name in MEMBER_PROGRESS:
                setattr(self, item.name, item.default_factory() if item.default is MISSING else item.default)


@dataclass
class MemberResult:
    test: dict | None
    dev_best: dict
    best_epoch: int | None  # None when evaluations are counted in steps (then best_step)
    epochs_run: int | None
    history: list[dict]
    train_seconds: float
    train_steps: int
    eval_seconds: float
    test_seconds: float
    train_seconds_share: float  # its part of train_seconds and eval_seconds: by its share of the rows (`shares`)
    eval_seconds_share: float
    gates: dict | None
    predictions: np.ndarray | None
    error: str | None = None
    best_step: int | None = None  # the step of the best dev evaluation (train.eval_every set)
    logits: np.ndarray | None = None   # the test rows' outputs (rows × classes; STS-B: rows × 1), whence predictions
    pruned: dict | None = None  # stopped by successive halving (peltbench.halving): the rung and why; no test score


Logger = Callable[[int, int, dict], None]  # (member index, epoch, metrics)


def fit(model, members: list[Member], task: TaskSpec, group: GroupSettings,
        on_done: Callable[[int, MemberResult], None], on_epoch: Logger | None = None, halving=None,
        checkpoint=None) -> None:
    """Train the group until every member has stopped; `on_done(index, result)` for each, as it stops.

    `halving(evaluation, histories, active, stopping)` (peltbench.halving.Halving), after each dev evaluation: the
    members it names stop there, pruned (no test pass), with `MemberResult.pruned` saying why.

    `checkpoint` (peltbench.checkpoint.Checkpointer): at every step boundary, when `checkpoint.due()` or a stop signal
    waits there (peltbench.interrupts), `checkpoint.save(state)` gets the loop's whole state (`Training.state`);
    training starts from `checkpoint.resume` (such a state) when it has one. Members that are not `wanted` (a resumed
    group's runs whose records exist) train along only while a wanted member does.

    The loop runs in evaluation periods: an epoch, or `eval_every` steps (members of a group share it: fusion.py).
    Each member's seconds are those of the loop it was in (its group's); its `*_seconds_share` is its part of them,
    each pass split by its share of the rows (`shares`).
    """
    Training(model, members, task, group, on_done, on_epoch, halving, checkpoint).run()


class ResumeError(Exception):
    """A checkpoint's state that cannot be put back into its group (raised before any step: the group starts over)."""


@dataclass
class _Period:
    """The evaluation period in progress: each step's losses so far (on the device), rows, and the seconds of its
    steps in earlier jobs (a resumed period)."""

    losses: list[torch.Tensor] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    seconds: float = 0.0


# What a member's checkpoint holds of the loop's bookkeeping (`Member`'s fields that training changes)
MEMBER_PROGRESS = ("history", "best_score", "best_epoch", "dev_best", "best_state", "train_seconds", "eval_seconds",
                   "train_seconds_share", "eval_seconds_share", "steps", "error")


class Training:
    """The training loop of `fit`, whose whole state at a step boundary is `state()`, put back with `restore()`: the
    position (evaluations done, the active members, the steps of the period in progress and their losses), every
    member's bookkeeping (history, best score and state, patience, seconds), the trained tensors, the optimiser
    (`MemberAdamW.state`), what components keep beside their tensors (methods.component_state: AdaLoRA's budget), the
    members' data order and the random generators."""

    def __init__(self, model, members: list[Member], task: TaskSpec, group: GroupSettings,
                 on_done: Callable[[int, MemberResult], None], on_epoch: Logger | None = None, halving=None,
                 checkpoint=None) -> None:
        self.model, self.members, self.task, self.group = model, members, task, group
        self.on_done, self.on_epoch, self.halving, self.checkpoint = on_done, on_epoch, halving, checkpoint
        self.steps_per_epoch, self.optimizer, self.clip, self.data = start_training(model, members, group)
        self.period = members[0].settings.period(self.steps_per_epoch)
        self.dev = [EvaluationSet(m.dev, group) for m in members]
        self.test = [EvaluationSet(m.test, group) for m in members]
        self.active = list(range(len(members)))
        self.evaluation = 0   # dev evaluations done
        self.current = _Period()
        self._started = 0.0   # when this job began the period in progress (perf_counter)
        if checkpoint is not None and checkpoint.resume is not None:
            try:
                self.restore(checkpoint.resume)
            except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as error:
                raise ResumeError(f"its state does not fit this group ({error})") from error

    def run(self) -> None:
        members, group = self.members, self.group
        total = max(-(-m.settings.total_steps(self.steps_per_epoch) // self.period) for m in members)
        in_steps = members[0].settings.eval_every is not None
        bar = progress(total=total, desc="evaluation" if in_steps else "epoch", unit="eval" if in_steps else "epoch",
                       lines=False, outermost=True)
        if self.evaluation:
            bar.update(self.evaluation)
        with step_boundaries():
            while self.active and any(members[m].wanted for m in self.active):
                self._period()
                bar.update(1)  # after the test pass of the members that stop: its progress lines name this epoch
        bar.close()
        self.model.members.set_active(None)

    def _period(self) -> None:
        """One evaluation period: its (remaining) steps, the dev evaluation, and the members that stop after it."""
        model, members, group, period, active = self.model, self.members, self.group, self.period, self.active
        model.members.set_active(active, group.device)
        first = self.evaluation * period
        start = self._started = _now(group.device)
        losses, first_bad = _train_steps(model, members, active, self.task, group, self.optimizer, self.clip,
                                         self.data, first, period, self.current, self._boundary)
        seconds = self.current.seconds + _now(group.device) - start
        self.current = _Period()
        self.evaluation += 1
        evaluation, step = self.evaluation, first + period
        model.members.start_gate_recording()
        scores, eval_seconds = evaluate(model, [self.dev[m] for m in active], self.task, group, "dev")
        gates = model.members.stop_gate_recording()
        train_shares = shares(seconds, [_rows_trained(len(members[m].train), group.batch_size, self.steps_per_epoch,
                                                      first, period) for m in active])
        eval_shares = shares(eval_seconds, [len(self.dev[m]) for m in active])
        stopping = []
        for position, m in enumerate(active):
            member = members[m]
            member.train_seconds += seconds
            member.eval_seconds += eval_seconds
            member.train_seconds_share += train_shares[position]
            member.eval_seconds_share += eval_shares[position]
            member.steps += period
            if first_bad[position] >= 0:  # the loss went non-finite: stop at once, with the reason
                member.error = _diverged(member, losses[position], evaluation, first_bad[position], period, step)
                stopping.append(m)
                continue
            score = scores[position]["main"]
            member.history.append({_unit(member): evaluation if member.settings.eval_every is None else step,
                                   "train_loss": losses[position], "dev_main": score})
            score = -math.inf if score is None else score
            if member.best_state is None or score > member.best_score:  # strict improvement only (HF)
                member.best_score, member.best_epoch, member.dev_best = score, evaluation, scores[position]
                member.best_state = member_state(model, m)
            if self.on_epoch is not None:
                self.on_epoch(m, evaluation, _epoch_metrics(losses[position], scores[position],
                                                            self.optimizer.lr_at(m, step - 1), seconds + eval_seconds,
                                                            gates[m]))
            patience = member.settings.patience
            if (patience is not None and evaluation - member.best_epoch >= patience) or \
                    step >= member.settings.total_steps(self.steps_per_epoch):
                stopping.append(m)
        pruned = self.halving(evaluation, [m.history for m in members], active, stopping) if self.halving else {}
        _log_epoch(members, active, evaluation, losses, scores, seconds + eval_seconds, self.task)
        for m in [*stopping, *pruned]:
            self.optimizer.leave(m)
        if stopping:
            _finish(model, members, stopping, self.test, self.task, group, evaluation, period, self.on_done)
        if pruned:
            _prune(members, pruned, evaluation, period, self.on_done)
        self.active = [m for m in active if m not in stopping and m not in pruned]

    def _boundary(self) -> None:
        """Between two training steps (and before the first and after the last of a period): write a checkpoint when
        one is due or a stop signal waits, then do what the signal asks (peltbench.interrupts)."""
        stopping = stop_pending()
        if self.checkpoint is not None and (stopping or self.checkpoint.due()):
            self.checkpoint.save(self.state, self.progress())
        if stopping:
            stop()

    def progress(self) -> dict:
        """How far the group is: `steps` done, and each member's unit (epoch, or step under train.eval_every), how many
        it has done, of how many planned, and whether it still trains (peltbench-missing: `resumable, epoch 12 of
        50`)."""
        steps = self.evaluation * self.period + len(self.current.rows)
        members = []
        for m, member in enumerate(self.members):
            total = member.settings.total_steps(self.steps_per_epoch)
            if member.settings.eval_every is None:
                done = {"unit": "epoch", "done": self.evaluation, "of": -(-total // self.steps_per_epoch),
                        "steps_into_next": len(self.current.rows)}
            else:
                done = {"unit": "step", "done": steps, "of": total}
            members.append({**done, "training": m in self.active})
        return {"steps": steps, "members": members}

    def state(self) -> dict:
        """The loop's whole state now, at a step boundary: tensors as they are (on their device; a checkpoint writes
        them as it reads them, so nothing is copied twice), the rest as plain values."""
        current = self.current
        return {
            "evaluation": self.evaluation, "active": list(self.active),
            "period": {"losses": torch.stack(current.losses) if current.losses else None, "rows": list(current.rows),
                       "seconds": current.seconds + (time.perf_counter() - self._started if current.rows else 0.0)},
            "members": [{key: getattr(member, key) for key in MEMBER_PROGRESS} for member in self.members],
            "parameters": self._trained_tensors(),
            "optimizer": self.optimizer.state(),
            "components": component_state(self.model),
            "data": self.data.state(),
            "random": random_state(self.group.device),
        }

    def _trained_tensors(self) -> dict:
        """The trained parameters: a backbone weight (fine-tuning) as it is, a member-stacked one as the slots some
        member trains ({slots, values}, a copy of those slots): the others hold what the model was built with and
        never change (no step updates a slot its member does not train), so the checkpoint leaves them out (in a
        mixed group, each component's tensors have a slot for every member)."""
        tensors = {}
        for name, parameter, flags, stacked in self.model.member_parameters():
            if not stacked:
                tensors[name] = parameter.detach()
                continue
            slots = [m for m, trains in enumerate(flags) if trains]
            tensors[name] = {"slots": slots, "values": parameter.detach()[slots] if len(slots) < len(flags)
                             else parameter.detach()}
        return tensors

    @torch.no_grad()
    def restore(self, state: dict) -> None:
        """Put back a `state()` (its tensors anywhere: each is copied to where the loop's own lives)."""
        self.evaluation, self.active = int(state["evaluation"]), [int(m) for m in state["active"]]
        period = state["period"]
        losses = period["losses"]
        self.current = _Period([] if losses is None else list(losses.to(self.group.device).unbind(0)),
                               [int(rows) for rows in period["rows"]], float(period["seconds"]))
        device = self.group.device
        for member, saved in zip(self.members, state["members"], strict=True):
            for key in MEMBER_PROGRESS:
                value = saved[key]
                if key == "best_state" and value is not None:
                    value = {name: tensor.to(device) for name, tensor in value.items()}
                setattr(member, key, value)
        parameters = {name: parameter for name, parameter, _, _ in self.model.member_parameters()}
        if set(parameters) != set(state["parameters"]):
            raise ValueError("the checkpoint's trained tensors are not this group's")
        for name, parameter in parameters.items():
            saved = state["parameters"][name]
            if isinstance(saved, dict):  # the slots some member trains
                slots = torch.tensor(saved["slots"], device=parameter.device)
                parameter.index_copy_(0, slots, saved["values"].to(parameter.device, parameter.dtype))
            else:
                parameter.copy_(saved)
        self.optimizer.restore(state["optimizer"])
        restore_components(self.model, state["components"])
        self.data.restore(state["data"])
        restore_random(state["random"], device)


def start_training(model, members: list[Member], group: GroupSettings):
    """What training the group needs before its first step: (steps per epoch, the optimiser with each member's
    schedule, each member's clipping norm, the members' data order); components plan their schedules (AdaLoRA)."""
    steps_per_epoch = math.ceil(len(members[0].train) / group.batch_size)
    optimizer = MemberAdamW(model)
    for m, member in enumerate(members):
        optimizer.schedule(m, member.settings.lr, member.settings.total_steps(steps_per_epoch))
    plan_training(model, [member.settings.total_steps(steps_per_epoch) for member in members])
    clip = torch.tensor([m.settings.grad_clip for m in members], device=group.device)
    return steps_per_epoch, optimizer, clip, _DataOrder(members, steps_per_epoch)


def shares(seconds: float, rows: list[int]) -> list[float]:
    """A pass's wall time split by each member's share of the rows it computed: a fused member's part of its group's
    seconds (records `train_seconds_share`, `eval_seconds_share`). A member alone gets all of them, exactly."""
    total = sum(rows)
    return [seconds * (r / total) if total else seconds / len(rows) for r in rows]


def _rows_trained(size: int, batch_size: int, steps_per_epoch: int, first_step: int, count: int) -> int:
    """The training rows a member of `size` rows trains in steps first_step .. first_step + count - 1 (_DataOrder's
    batches: an epoch's last one may be short)."""
    return sum(max(0, min(batch_size, size - (step % steps_per_epoch) * batch_size))
               for step in range(first_step, first_step + count))


def _unit(member: Member) -> str:
    """What a history entry counts: `epoch` (dev after every epoch) or `step` (dev every eval_every steps)."""
    return "epoch" if member.settings.eval_every is None else "step"


def _diverged(member: Member, loss: float, evaluation: int, bad: int, period: int, step: int) -> str:
    if member.settings.eval_every is None:
        where = f"epoch {evaluation}, step {bad + 1} of {period}"
    else:
        where = f"step {step - period + bad + 1}"
    return f"the training loss became {loss} at {where}: lower method.lr or check the data"


class _DataOrder:
    """Each member's order of its training rows: a fresh permutation per epoch from its own generator (the model
    seed), drawn when the member's first step of that epoch comes, so a period may end inside an epoch."""

    def __init__(self, members: list[Member], steps_per_epoch: int) -> None:
        self.shufflers = [torch.Generator().manual_seed(m.settings.seed) for m in members]
        self.sizes = [len(m.train) for m in members]
        self.orders: dict[int, list[int]] = {}
        self.steps_per_epoch = steps_per_epoch

    def rows(self, m: int, step: int, batch_size: int) -> list[int]:
        position = step % self.steps_per_epoch
        if position == 0:
            self.orders[m] = torch.randperm(self.sizes[m], generator=self.shufflers[m]).tolist()
        return self.orders[m][position * batch_size : (position + 1) * batch_size]

    def state(self) -> dict:
        """Each member's generator and its order of the epoch in progress."""
        return {"shufflers": [shuffler.get_state() for shuffler in self.shufflers],
                "orders": {m: list(order) for m, order in self.orders.items()}}

    def restore(self, state: dict) -> None:
        for shuffler, saved in zip(self.shufflers, state["shufflers"], strict=True):
            shuffler.set_state(saved)
        self.orders = {int(m): [int(row) for row in order] for m, order in state["orders"].items()}


def random_state(device: torch.device) -> dict:
    """The process's random generators (torch's on the CPU and on a CUDA device, numpy's, Python's): nothing in the
    loop draws from them (dropout masks are computed: methods/randomness.py; data order: each member's generator),
    but what a component or library might is kept too."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                       "has_gauss": int(has_gauss), "cached": float(cached)}}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_random(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _train_steps(model, members, active, task, group, optimizer, clip, data, first_step, count, current=None,
                 boundary=None):
    """`count` steps of the active members from global step `first_step`; per member its mean loss over the rows it
    saw, and the first step (counted from `first_step`) whose loss was not finite (-1). The losses stay on the device
    until the period ends: one copy to the host then (`_period_losses`), none inside a step.

    `current` (_Period): the steps of this period already done (a resumed period goes on after them), to which each
    step adds its losses and rows; `boundary()` is called between steps, before the first and after the last (a
    checkpoint may be written there: Training._boundary)."""
    model.train()
    current = _Period() if current is None else current
    settings = [member.settings for member in members]
    passes = member_passes(len(active), group)
    for step in progress(range(len(current.rows), count), "train", unit="step", advances_outer=True):
        if boundary is not None:
            boundary()
        rows = [data.rows(m, first_step + step, group.batch_size) for m in active]
        for m, chosen in zip(active, rows):
            members[m].train.draw(first_step + step, chosen)  # demonstrations: this step's inputs of these rows
        losses = []
        for chosen in passes:  # the members whose forward and backward run together (all of them, or a few at a time)
            if len(passes) > 1:
                model.members.set_active([active[i] for i in chosen], group.device)
            losses.append(_train_pass(model, members, [active[i] for i in chosen], [rows[i] for i in chosen], task,
                                      group, settings, first_step + step))
        if len(passes) > 1:
            model.members.set_active(active, group.device)
        clip_per_member(optimizer, clip)
        optimizer.step(first_step + step)
        after_step(model, first_step + step)  # reads this step's gradients (AdaLoRA's importance)
        optimizer.zero_grad()
        current.losses.append(losses[0] if len(losses) == 1 else torch.cat(losses))
        current.rows.append(len(rows[0]))
    if boundary is not None:
        boundary()
    return _period_losses(current.losses, current.rows)


def _period_losses(step_losses: list[torch.Tensor], step_rows: list[int]) -> tuple[list[float], list[int]]:
    """Each member's mean loss over a period's rows (its losses weighted by each step's rows, summed step after step in
    float32), and the first step whose loss was not finite (-1): from one copy of the period's losses to the host."""
    values = torch.stack(step_losses).float().cpu().numpy()
    total = np.zeros(values.shape[1], dtype=np.float32)
    first_bad = np.full(values.shape[1], -1)
    with np.errstate(all="ignore"):
        for step, (losses, rows) in enumerate(zip(values, step_rows)):
            total = total + losses * np.float32(rows)
            first_bad = np.where(~np.isfinite(losses) & (first_bad < 0), step, first_bad)
        return (total / np.float32(sum(step_rows))).tolist(), first_bad.tolist()


def _train_pass(model, members, chosen, rows, task, group, settings, step) -> torch.Tensor:
    """Forward and backward of the `chosen` members' rows of a step (the model's active members); their losses."""
    sets = [members[m].train for m in chosen]
    losses = None
    for piece in pieces(sets, rows, group):  # one forward and backward per piece (one piece: the whole batch)
        batch = collate_group(sets, piece, group.pad_id, group.device, group.pad_to)
        model.members.set_dropout_keys(step_keys(settings, chosen, step, piece, model.members.dropout_sites,
                                                 group.device))
        with _autocast(group):
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = member_losses(logits, batch["labels"], len(chosen), task)
        extra = regulariser(model)  # a component's term of each member's loss (AdaLoRA's orthogonality)
        share = loss if extra is None else loss + extra
        if len(piece[0]) != len(rows[0]):  # a piece of the step: its share of each member's rows
            share = share * (len(piece[0]) / len(rows[0]))
        share.sum().backward()
        losses = share.detach() if losses is None else losses + share.detach()
    return losses


def member_passes(count: int, group: GroupSettings) -> list[list[int]]:
    """The positions of a step's `count` active members, cut into the passes that run together: one pass on a GPU
    (it waits on launches, so the bigger the better), `members_per_pass` members at a time on a CPU."""
    size = group.members_per_pass or count
    return [list(range(start, min(start + size, count))) for start in range(0, count, size)]


def pieces(sets: list[Encoded], rows: list[list[int]], group: GroupSettings) -> list[list[list[int]]]:
    """The step's rows: one piece, or (on a CPU) up to TRAIN_PIECES: each member's rows sorted by length and cut into
    equal parts of at least MIN_PIECE_ROWS rows, at positions that depend on its own rows only, never on the other
    members': a member's loss and gradients sum the same parts of its batch alone and in any group (a cut chosen from
    all members' lengths, as evaluation's are, would group its rows otherwise in another group, and a sum grouped
    otherwise rounds otherwise; every member of a step has the same number of rows). On SST-2 (K = 100, batch 16)
    4 parts pad to 1.28× the real tokens, against 1.68× for the two halves before and 2.75× for one pass."""
    if not group.split_by_length or group.pad_to is not None:
        return [rows]
    parts = min(TRAIN_PIECES, max(len(chosen) for chosen in rows) // MIN_PIECE_ROWS)
    if parts < 2:
        return [rows]
    ordered = [sorted(chosen, key=lambda r, s=s: len(s.input_ids[r])) for s, chosen in zip(sets, rows)]
    return [[o[len(o) * j // parts : len(o) * (j + 1) // parts] for o in ordered] for j in range(parts)]


TRAIN_PIECES, MIN_PIECE_ROWS = 4, 4  # a CPU's training pass in at most 4 length-sorted parts of at least 4 rows each
PIECE_COST = 0.05  # an evaluation piece more pays when it saves this share of one pass's padded tokens (docs/fused.md)


def length_cuts(lengths: list[list[int]], group: GroupSettings) -> list[int] | None:
    """Where to cut the members' evaluation rows (each member's lengths, ascending) into passes that pad less than one:
    the ends of the pieces, the same positions for every member (piece j: each member's rows cuts[j-1]:cuts[j]), or
    None. (Evaluation scores each row alone, so its cuts may depend on every member's rows; a training step's may not:
    `pieces`.)

    On the CPU padding costs compute, and in a group the longest row among all members sets every row's width. The
    cuts minimise the padded tokens, rows × width summed over the pieces, plus PIECE_COST of one pass's tokens for
    each piece after the first (a pass has a cost of its own): one exact search over the cut positions. The scores
    are the same to float rounding. On a GPU one pass is cheaper (it waits on launches, not on arithmetic), and with
    gate_pooling=padded every row has max length anyway.
    """
    if not group.split_by_length or group.pad_to is not None:
        return None
    lengths = [member for member in lengths if member]
    if not lengths:
        return None
    n = max(len(member) for member in lengths)
    # a pass of each member's rows start:stop holds stop - start rows per member (the longest member has them all),
    # as wide as the widest row among them: the largest of `top` over start:stop (a member's rows are ascending)
    top = [max(member[j] for member in lengths if len(member) > j) for j in range(n)]
    whole = len(lengths) * n * max(top)
    best, back = [0.0] + [float("inf")] * n, [0] * (n + 1)  # best[j]: the cheapest pieces of rows 0:j
    for start in range(n):
        width, extra = 0, PIECE_COST * whole if start else 0.0
        for stop in range(start + 1, n + 1):
            width = max(width, top[stop - 1])
            cost = best[start] + len(lengths) * (stop - start) * width + extra
            if cost < best[stop]:
                best[stop], back[stop] = cost, start
    cuts, stop = [], n
    while stop:
        cuts.append(stop)
        stop = back[stop]
    return cuts[::-1] if len(cuts) > 1 else None


def member_losses(logits: torch.Tensor, labels: torch.Tensor, members: int, task: TaskSpec) -> torch.Tensor:
    """Each member's mean loss over its own rows: (members,). Cross-entropy, or MSE for regression (STS-B); a cloze
    head's regression outputs (two columns: `poles`) take LM-BFF's loss."""
    if task.is_regression and logits.shape[-1] == 2:
        per_row = pole_losses(logits, labels, task)
    elif task.is_regression:
        per_row = F.mse_loss(logits.squeeze(-1), labels, reduction="none")
    else:
        per_row = F.cross_entropy(logits, labels, reduction="none")
    return per_row.view(members, -1).mean(dim=1)


def pole_losses(log_probs: torch.Tensor, labels: torch.Tensor, task: TaskSpec) -> torch.Tensor:
    """LM-BFF's regression loss per row (src/models.py, *ForPromptFinetuning): the score y in [lb, ub] as a target
    between the two poles, p = (y - lb) / (ub - lb), against the log-probabilities of the low and high label words,
    by `nn.KLDivLoss(log_target=True)` with its mean over both columns. Their target is the probabilities [1 - p, p]
    although log_target=True reads it as log-probabilities: the loss is mean(e^t (t - log q)), not KL(p ‖ q); kept
    as they have it (docs/protocol.md)."""
    low, high = task.label_range
    p = (labels.view(-1) - low) / (high - low)
    target = torch.stack([1 - p, p], dim=-1)
    return (target.exp() * (target - log_probs)).mean(dim=-1)


def clip_per_member(optimizer: MemberAdamW, max_norm: torch.Tensor) -> None:
    """Clip each member's gradient to its own global norm (torch.nn.utils.clip_grad_norm_ per member):
    `MemberAdamW.clip`."""
    optimizer.clip(max_norm)


class MemberAdamW:
    """AdamW over member-stacked parameters, with one learning rate and schedule per member.

    Elementwise, so each member's slice follows torch.optim.AdamW exactly as a separate optimiser would
    (β = (0.9, 0.999), ε = 1e-8, weight decay 0: the official code's Hugging Face defaults), and Hugging
    Face's linear schedule with no warm-up, from the member's lr down to 0 over its planned epochs.
    A member that does not train a slot, or has left the group, gets learning rate 0 there.

    Its state is torch's, kept per (parameter, member) slot: the two moments and the slot's step count, which sets its
    bias corrections. A slot that gets no gradient on a step keeps all three as they are, as torch.optim.AdamW skips a
    parameter whose `.grad` is None: a parameter none of whose members' rows reached it (its `.grad` is None), and a
    member that has left the group (its separate optimiser would step no more). `state` / `restore` hand it over (a
    checkpoint).

    A parameter is updated over its span of member slots only, from the first member that trains it to the last (the
    runner seats members with the same components side by side, methods.layout_key): in a mixed group each
    component's tensors have a slot for every member, and the optimiser's work stays what the members that train
    them would do apart, not the group's size times each component's.

    A step is a few operators for the whole group, whatever its number of tensors (issue 38): the parameters of one
    dtype and device form a `_Bank`, whose gradients' spans are copied with one `_foreach_copy_` into one flat buffer,
    which the clipping and AdamW work on as one tensor, each (parameter, member) slot a segment of it: per-segment
    norms with one `_foreach_norm`, per-member values spread over the segments with one `index_select`; the
    clipped gradients go back to `p.grad` with one more (`after_step` reads them). The moments are flat buffers of the
    spans; one `_foreach_add_` adds the update to the parameters. The learning rates and step counts are host values
    (no step reads a value from the device), and every view is made once when the optimiser is built, but one per
    parameter and step whose span is not all of it: the span of its new gradient (a view, no computation; copying
    every whole gradient into a flat buffer instead copied 497 MB per step for the mixed grid on MiniLM:
    docs/fused.md); and, when the slots without a gradient change (a member leaves), the runs of the moments that
    step around them.
    """

    def __init__(self, model, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.members = model.members.count
        self.betas, self.eps = betas, eps
        self.lr = [0.0] * self.members
        self.total_steps = [1.0] * self.members
        self.training = [False] * self.members
        grouped: dict[tuple, list] = {}
        for _, parameter, flags, stacked in model.member_parameters():
            grouped.setdefault((parameter.dtype, parameter.device), []).append((parameter, flags, stacked))
        self.banks = [_Bank(entries) for entries in grouped.values()]
        self.params = [parameter for bank in self.banks for parameter in bank.params]
        self._gathered = False
        self._norm_rows: _NormRows | None = None  # where each member's norms are, for the banks present this step

    def schedule(self, member: int, lr: float, total_steps: int) -> None:
        self.lr[member], self.total_steps[member], self.training[member] = float(lr), float(max(total_steps, 1)), True

    def leave(self, member: int) -> None:
        self.training[member] = False

    def lr_at(self, member: int, step: int) -> float:
        """The learning rate of `member` at (0-based) step `step`: linear decay to 0, no warm-up."""
        total = self.total_steps[member]
        return self.lr[member] * max(0.0, (total - step) / total)

    @torch.no_grad()
    def clip(self, max_norm: torch.Tensor) -> None:
        """Clip each member's gradient to its own global norm: torch.nn.utils.clip_grad_norm_ per member, bit for bit
        on a CPU.

        Only the slots a member trains count: gradients that reached other members' untrained slots are zeroed (within
        the parameter's trained span; the optimiser reads no slot outside it). A member's norm is torch's: the vector
        norm of its parameters' norms, those with a gradient, in its parameters' order, as a row of exactly their
        number (`_NormRows`: one reduction per number of parameters in the group), so it is the same in any group (a
        cumsum of the squares, or a row padded with zeros, differ from torch's in the last bit for 36 % and 18 % of
        random rows of 1 to 259 norms); the coefficient `max_norm / (norm + 1e-6)` as torch computes it, the
        reciprocal times max_norm (a division rounds otherwise in 29 % of cases)."""
        banks = self._gather()
        if not banks:
            return
        norms = [torch.stack(torch._foreach_norm(bank.trained_views)) for bank in banks]
        norms = norms[0] if len(norms) == 1 else torch.cat(norms)
        if self._norm_rows is None or not self._norm_rows.fits(banks):
            self._norm_rows = _NormRows(banks, self.members)
        total = self._norm_rows.totals(norms)
        coefficient = (total + 1e-6).reciprocal_().mul_(max_norm).clamp_(max=1.0)
        for bank in banks:
            bank.scale(coefficient)

    @torch.no_grad()
    def step(self, step: int) -> None:
        banks = self._gather()
        self._gathered = False
        lrs = np.array([self.lr_at(m, step) if self.training[m] else 0.0 for m in range(self.members)])
        for bank in banks:
            bank.adamw(lrs, np.array(self.training), self.betas, self.eps)

    def state(self) -> dict:
        """Everything the optimiser keeps but the parameters themselves: its own values (step count, each member's
        learning rate, schedule and whether it trains) and each bank's (its moments; any tensor or array it keeps whole,
        whatever it is called), read generically (`_kept`), so that state added later is kept too."""
        params = {parameter.untyped_storage().data_ptr() for parameter in self.params}
        return {"optimizer": _kept(self, params), "banks": [_kept(bank, params) for bank in self.banks]}

    @torch.no_grad()
    def restore(self, state: dict) -> None:
        _put(self, state["optimizer"])
        for bank, saved in zip(self.banks, state["banks"], strict=True):
            _put(bank, saved)

    def zero_grad(self) -> None:
        for parameter in self.params:
            parameter.grad = None
        for bank in self.banks:
            bank.release()
        self._gathered = False

    def _gather(self) -> list[_Bank]:
        """The banks with gradients this step, their gradients gathered (once per step)."""
        if not self._gathered:
            self._present = [bank for bank in self.banks if bank.gather()]
            self._gathered = True
        return self._present


def _kept(owner, params: set[int]) -> dict:
    """The state of an optimiser object, generically: each attribute that is a plain value (number, string, None), a
    tensor that owns its memory whole (not a view, not a parameter, not a buffer whose memory is handed back between
    steps), a numpy array, or a list, tuple or dict of only such values."""
    kept = {}
    for name, value in vars(owner).items():
        plain = _plain(value, params)
        if plain is not _SKIP:
            kept[name] = plain
    return kept


_SKIP = object()


def _plain(value, params: set[int]):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        whole = storage.nbytes() == value.numel() * value.element_size() and value.storage_offset() == 0
        if isinstance(value, torch.nn.Parameter) or not whole or not storage.nbytes() \
                or storage.data_ptr() in params:
            return _SKIP
        return value.detach()
    if isinstance(value, (list, tuple)):
        items = [_plain(item, params) for item in value]
        return _SKIP if any(item is _SKIP for item in items) else type(value)(items) if isinstance(value, list) \
            else tuple(items)
    if isinstance(value, dict):
        items = {key: _plain(item, params) for key, item in value.items()}
        return _SKIP if any(item is _SKIP for item in items.values()) else items
    return _SKIP


def _put(owner, saved: dict) -> None:
    """Put back what `_kept` read: tensors and arrays in place (views of them stay valid), the rest as attributes."""
    for name, value in saved.items():
        setattr(owner, name, _restored(getattr(owner, name, None), value, name))


def _restored(current, value, name: str):
    if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
        if current.shape != value.shape:
            raise ValueError(f"the checkpoint's optimiser {name} has shape {tuple(value.shape)}, this group's "
                             f"{tuple(current.shape)}")
        return current.copy_(value)
    if isinstance(current, np.ndarray) and isinstance(value, torch.Tensor):
        np.copyto(current, value.numpy())
        return current
    if isinstance(current, np.generic):
        return type(current)(value)
    if isinstance(current, (list, tuple)) and isinstance(value, (list, tuple)) and len(current) == len(value):
        items = [_restored(c, v, name) for c, v in zip(current, value)]
        return items if isinstance(current, list) else tuple(items)
    if isinstance(current, dict) and isinstance(value, dict):
        return {key: _restored(current.get(key), item, name) for key, item in value.items()}
    return value


class _Bank:
    """The trained parameters of one dtype and device, and their optimiser state as flat buffers (MemberAdamW).

    `spans`: this step's gradients of each parameter's span of member slots, one after the other (clipped there, then
    the update); `exp_avg`, `exp_avg_sq`: the moments, in the same layout. `spans` holds memory only from `gather` to
    `zero_grad` (`release`). A segment is one (parameter, member) slot of a span: `segment_index` says whose (on the
    device, as `segment_members` on the host), `lengths` its size, `trained` whether that member trains the
    parameter, `steps` how many steps it has taken (torch's `state["step"]` of that member's parameter)."""

    def __init__(self, entries: list[tuple[torch.Tensor, list[bool], bool]]) -> None:
        self.params = [parameter for parameter, _, _ in entries]
        first = entries[0][0]
        dtype, device = first.dtype, first.device
        segments = []
        self.slots: list[tuple[int, int]] = []  # each parameter's span of member slots
        self.cuts: list[slice | None] = []       # where a parameter's span is not all of it: its slots' slice
        for index, (parameter, flags, stacked) in enumerate(entries):
            if stacked:  # the slots from the first member that trains it to the last
                start, stop = flags.index(True), len(flags) - flags[::-1].index(True)
            elif len(flags) == 1:  # a backbone weight (fine-tuning, a group of one): one slot, member 0's
                start, stop = 0, 1
            else:  # build_pelt_model refuses it (methods.base.check_marks): member 0 alone would move the tensor
                raise ValueError(f"a trained tensor of shape {tuple(parameter.shape)} has no member dimension in a "
                                 f"group of {len(flags)} members: it would move through member 0 only")
            self.slots.append((start, stop))
            self.cuts.append(slice(start, stop) if stacked and stop - start < parameter.shape[0] else None)
            size = parameter[0].numel() if stacked else parameter.numel()
            segments += [(index, m, size, bool(flags[m])) for m in range(start, stop)]
        self.span_size = sum(size for *_, size, _ in segments)
        self.spans = torch.empty(self.span_size, dtype=dtype, device=device)
        self.exp_avg = torch.zeros(self.span_size, dtype=dtype, device=device)
        self.exp_avg_sq = torch.zeros(self.span_size, dtype=dtype, device=device)
        # the views, made once: each parameter's span in `spans` and in the parameter itself, each segment in `spans`
        self.span_views, self.param_spans, at = [], [], 0
        for parameter, cut in zip(self.params, self.cuts):
            span = parameter.detach() if cut is None else parameter.detach()[cut]
            self.span_views.append(self.spans[at : at + span.numel()].view(span.shape))
            self.param_spans.append(span)
            at += span.numel()
        self.starts = np.cumsum([0, *(size for *_, size, _ in segments)])  # where each segment starts, and the end
        starts = self.starts
        self.trained_views = [self.spans[starts[s] : starts[s + 1]] for s, seg in enumerate(segments) if seg[3]]
        self.untrained_views = [self.spans[starts[s] : starts[s + 1]] for s, seg in enumerate(segments) if not seg[3]]
        # each trained segment's member and parameter, in the order of `trained_views` (of their norms)
        self.norm_members = np.array([m for _, m, _, is_trained in segments if is_trained], dtype=np.int64)
        self.norm_params = np.array([index for index, _, _, is_trained in segments if is_trained], dtype=np.int64)
        self.segment_index = torch.tensor([m for _, m, _, _ in segments], device=device)
        self.lengths = torch.tensor([size for *_, size, _ in segments], dtype=torch.int32, device=device)
        self.segment_members = np.array([m for _, m, _, _ in segments])
        self.segment_params = np.array([index for index, *_ in segments])
        self.trained = np.array([is_trained for *_, is_trained in segments])
        self.steps = np.zeros(len(segments), dtype=np.int64)
        self.missing: list[int] = []  # the parameters without a gradient this step
        self.grads: list[torch.Tensor] = []  # this step's gradients' spans (views of each .grad), for the clipped ones
        self.segment_of: torch.Tensor | None = None
        self._runs: tuple[bytes, tuple] | None = None  # the moments' runs around the segments that do not step
        self.release()

    def release(self) -> None:
        """Hand back the memory of the gradient buffer between steps (its views stay valid: `acquire`), so the
        optimiser keeps nothing but its moments while the next forward and backward pass run."""
        self.spans.untyped_storage().resize_(0)
        self.grads, self.segment_of = [], None

    def acquire(self) -> None:
        if self.spans.untyped_storage().nbytes() == 0:
            self.spans.untyped_storage().resize_(self.spans.numel() * self.spans.element_size())

    def gather(self) -> bool:
        """Copy this step's gradients' spans into `spans` (untrained slots of a span zeroed); False if none."""
        present = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not present:
            return False
        self.acquire()
        self.missing = [i for i, p in enumerate(self.params) if p.grad is None]
        # a parameter's span of its gradient: a view where the span is not the whole parameter (made each step: the
        # gradient is a new tensor each step)
        self.grads = [self.params[i].grad if self.cuts[i] is None else self.params[i].grad[self.cuts[i]]
                      for i in present]
        torch._foreach_copy_([self.span_views[i] for i in present], self.grads)
        zeros = self.untrained_views + [self.span_views[i] for i in self.missing]  # a component none of whose
        if zeros:                                                                  # members is in the pass any more
            torch._foreach_zero_(zeros)
        self.present = present
        return True

    def spread(self, values: torch.Tensor) -> torch.Tensor:
        """Per-segment values (segments,) as one value per element of `spans` (each element's segment: made once per
        step, int32, freed with the gradients)."""
        if self.segment_of is None:
            segments = torch.arange(len(self.lengths), dtype=torch.int32, device=self.lengths.device)
            self.segment_of = torch.repeat_interleave(segments, self.lengths, output_size=self.span_size)
        return values.index_select(0, self.segment_of)

    def to_device(self, values: np.ndarray) -> torch.Tensor:
        """Host values on the bank's device, copied without waiting for the work queued before (pinned on CUDA)."""
        values = torch.from_numpy(values)
        if self.spans.device.type == "cuda":
            values = values.pin_memory()
        return values.to(self.spans.device, non_blocking=True)

    def scale(self, coefficient: torch.Tensor) -> None:
        """Each member's span gradients times its clipping coefficient; `p.grad` clipped (and zero in the untrained
        slots of its span) too, for what reads it after the step."""
        self.spans.mul_(self.spread(coefficient.index_select(0, self.segment_index)))
        torch._foreach_copy_(self.grads, [self.span_views[i] for i in self.present])

    def adamw(self, lrs: np.ndarray, training: np.ndarray, betas: tuple[float, float], eps: float) -> None:
        """One step of torch.optim.AdamW's (single-tensor) arithmetic for each segment that has a gradient: a member
        that trains the parameter and is still training, the parameter's `.grad` given; the others keep their state."""
        beta1, beta2 = betas
        stepping = self.trained & training[self.segment_members]
        if self.missing:
            stepping &= ~np.isin(self.segment_params, self.missing)
        self.steps += stepping
        exp_avg, exp_avg_sq, grads = self.moment_runs(self.trained & ~stepping)
        if grads:
            torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sq, beta2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        # each segment's bias corrections from its own step count, in float64 as torch computes them from its `step`
        counts, at = np.unique(np.maximum(self.steps, 1), return_inverse=True)
        correction1 = np.array([1 - beta1 ** float(c) for c in counts])
        correction2 = np.array([(1 - beta2 ** float(c)) ** 0.5 for c in counts])
        denominator = self.exp_avg_sq.sqrt()
        used = np.unique(at[stepping])  # the stepping segments' counts (all the same but after a skipped step)
        if len(used) > 1:
            denominator.div_(self.spread(self.to_device(correction2[at].astype(np.float32))))
        else:
            denominator.div_(float(correction2[used[0]]) if len(used) else 1.0)
        denominator.add_(eps)
        # −lr / (1 − β₁ᵗ) per segment, rounded to float32 as torch's addcdiv rounds its value; 0 where it keeps its state
        sizes = np.where(stepping, -(lrs[self.segment_members] / correction1[at]), 0.0).astype(np.float32)
        torch.mul(self.exp_avg, self.spread(self.to_device(sizes)), out=self.spans).div_(denominator)  # the update,
        torch._foreach_add_(self.param_spans, self.span_views)                                        # in `spans`

    def moment_runs(self, keep: np.ndarray) -> tuple[list, list, list]:
        """The moments' and gradients' runs of segments that step, around those that `keep` their state (the whole
        buffers when none do; made again only when the kept segments change)."""
        key = keep.tobytes() if keep.any() else b""
        if self._runs is None or self._runs[0] != key:
            if not key:
                runs = [(self.exp_avg, self.exp_avg_sq, self.spans)]
            else:
                edges = np.flatnonzero(np.diff(np.concatenate([[0], (~keep).astype(np.int8), [0]])))
                bounds = [(int(self.starts[s]), int(self.starts[e])) for s, e in zip(edges[::2], edges[1::2])]
                runs = [tuple(b[start:stop] for b in (self.exp_avg, self.exp_avg_sq, self.spans))
                        for start, stop in bounds]
            self._runs = (key, tuple(list(views) for views in zip(*runs)) if runs else ([], [], []))
        return self._runs[1]


class _NormRows:
    """Where each member's parameter norms lie among the present banks' norms (those of `trained_views`, bank after
    bank), without the parameters that have no gradient this step: members with the same number of them form a table
    (their norms gathered, a fresh (members, number) tensor), whose rows torch reduces each as it reduces that
    member's norms alone (`linalg.vector_norm` over the last dimension: the same kernel per row, whatever the number
    of rows). Made again only when the present banks or their parameters without a gradient change."""

    def __init__(self, banks: list[_Bank], members: int) -> None:
        self.key = self._key(banks)
        rows: list[list[int]] = [[] for _ in range(members)]
        offset = 0
        for bank in banks:
            has_gradient = ~np.isin(bank.norm_params, bank.missing)
            for position in np.flatnonzero(has_gradient):
                rows[bank.norm_members[position]].append(offset + int(position))
            offset += len(bank.norm_params)
        by_number: dict[int, list[int]] = {}
        for m, row in enumerate(rows):
            if row:
                by_number.setdefault(len(row), []).append(m)
        device = banks[0].spans.device
        self.members = members
        self.tables = [(torch.tensor(owners, device=device),
                        torch.tensor([rows[m] for m in owners], device=device).flatten(), len(owners), number)
                       for number, owners in by_number.items()]
        self.whole = len(self.tables) == 1 and self.tables[0][2] == members  # one table, every member in order

    @staticmethod
    def _key(banks: list[_Bank]) -> tuple:
        return tuple((id(bank), tuple(bank.missing)) for bank in banks)

    def fits(self, banks: list[_Bank]) -> bool:
        return self._key(banks) == self.key

    def totals(self, norms: torch.Tensor) -> torch.Tensor:
        """Each member's global norm (members,), 0 for a member without a gradient."""
        if self.whole:
            _, index, count, number = self.tables[0]
            return torch.linalg.vector_norm(norms.index_select(0, index).view(count, number), dim=1)
        total = torch.zeros(self.members, dtype=norms.dtype, device=norms.device)
        for owners, index, count, number in self.tables:
            total.index_copy_(0, owners, torch.linalg.vector_norm(norms.index_select(0, index).view(count, number),
                                                                  dim=1))
        return total


def _finish(model, members, stopping, test, task, group, evaluation, period, on_done) -> None:
    """The members that stop at this epoch: restore each one's best state, score their test sets together."""
    scored = [m for m in stopping if members[m].error is None]
    for m in scored:
        load_member_state(model, m, members[m].best_state)
    results: dict[int, tuple] = {}
    if scored:
        model.members.set_active(scored, group.device)
        model.members.start_gate_recording()
        scores, seconds, outputs = evaluate(model, [test[m] for m in scored], task, group, "test", keep=True)
        gates = model.members.stop_gate_recording()
        parts = shares(seconds, [len(test[m]) for m in scored])
        results = {m: (scores[i], seconds, parts[i], outputs[i], gates[m]) for i, m in enumerate(scored)}
    for m in stopping:
        member = members[m]
        test_scores, seconds, part, logits, gate_means = results.get(m, (None, 0.0, 0.0, None, None))
        member.best_state = None  # free it: the record is about to be written
        in_steps = member.settings.eval_every is not None
        on_done(m, MemberResult(
            test=test_scores, dev_best=member.dev_best, best_epoch=None if in_steps else member.best_epoch,
            epochs_run=None if in_steps else evaluation, history=member.history, train_seconds=member.train_seconds,
            train_steps=member.steps, eval_seconds=member.eval_seconds + seconds, test_seconds=seconds,
            train_seconds_share=member.train_seconds_share, eval_seconds_share=member.eval_seconds_share + part,
            gates=gate_means, predictions=None if logits is None else predicted(logits, task), error=member.error,
            logits=logits,
            best_step=member.best_epoch * period if in_steps else None,
        ))


def _prune(members, pruned: dict[int, dict], evaluation, period, on_done) -> None:
    """The members successive halving stops at this rung: no test pass; their dev history so far is their result."""
    for m, why in pruned.items():
        member = members[m]
        member.best_state = None
        in_steps = member.settings.eval_every is not None
        on_done(m, MemberResult(
            test=None, dev_best=member.dev_best, best_epoch=None if in_steps else member.best_epoch,
            epochs_run=None if in_steps else evaluation, history=member.history, train_seconds=member.train_seconds,
            train_steps=member.steps, eval_seconds=member.eval_seconds, test_seconds=0.0, gates=None,
            train_seconds_share=member.train_seconds_share, eval_seconds_share=member.eval_seconds_share,
            predictions=None, best_step=member.best_epoch * period if in_steps else None, pruned=why,
        ))


class EvaluationSet:
    """One member's evaluation rows: padded, length-sorted batches, built once on the host (`collate_host`: each
    evaluation pass copies the members' stacked chunks to the device at once)."""

    def __init__(self, encoded: Encoded, group: GroupSettings) -> None:
        order = sorted(range(len(encoded)), key=lambda r: len(encoded.input_ids[r]))
        chunks = [order[i : i + group.eval_batch_size] for i in range(0, len(order), group.eval_batch_size)]
        self.batches = [collate_host([encoded], [chunk], group.pad_id, group.pad_to)[0] for chunk in chunks]
        self.lengths = [[len(encoded.input_ids[r]) for r in chunk] for chunk in chunks]
        self.order = order
        self.labels = encoded.labels
        self.samples = encoded.samples

    def __len__(self) -> int:
        return len(self.labels)


@torch.inference_mode()
def evaluate(model, sets: list[EvaluationSet], task: TaskSpec, group: GroupSettings, label: str, keep: bool = False):
    """Score each active member on its own evaluation set, all of them in the same forward passes.

    Batch i holds every member's i-th length-sorted chunk; a member with fewer rows there repeats its first
    row to fill its block, and those rows are ignored. Returns the scores per member and the wall time (and
    with keep=True each member's outputs, rows × classes (STS-B: × 1) in the set's own row order: `predicted`).
    The outputs stay on the device until the last pass: one copy to the host then.
    """
    start = _now(group.device)
    model.eval()
    passes: list[tuple[torch.Tensor, list[int]]] = []
    count = max(len(s.batches) for s in sets)
    for i in progress(range(count), label, unit="batch"):
        for parts in _evaluation_pieces(sets, i, group):
            batch, sizes = _stack_blocks(parts, group.pad_id, group.device)
            model.members.set_gate_rows(batch["real"])
            with _autocast(group):
                passes.append((model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]), sizes))
    model.members.set_gate_rows(None)
    host = torch.cat([logits for logits, _ in passes]).float().cpu().numpy()  # one device-to-host copy
    outputs: list[list[np.ndarray]] = [[] for _ in sets]
    offset = 0
    for logits, sizes in passes:
        block = logits.shape[0] // len(sets)
        for position, size in enumerate(sizes):
            outputs[position].append(host[offset + position * block : offset + position * block + size])
        offset += logits.shape[0]
    scores, kept = [], []
    for s, parts in zip(sets, outputs):
        values = np.empty((len(s), host.shape[1]), dtype=np.float32)
        values[s.order] = np.concatenate(parts)
        values = mean_over_samples(values, s.samples, task)
        labels = s.labels[: len(values)]
        scores.append(compute_metrics(task.metrics, task.main_metric, predicted(values, task), labels))
        kept.append(values)
    seconds = _now(group.device) - start
    return (scores, seconds, kept) if keep else (scores, seconds)


def mean_over_samples(outputs: np.ndarray, samples: int, task: TaskSpec) -> np.ndarray:
    """Each row's output from its `samples` inputs (sample after sample: data.Encoded), as LM-BFF's
    `compute_metrics_fn` averages them: the mean of the logits; a cloze head's regression outputs (the poles'
    log-probabilities) averaged as the scores they give, which LM-BFF averages (the log of the mean probability)."""
    if samples == 1:
        return outputs
    stacked = outputs.reshape(samples, -1, outputs.shape[1])
    if task.is_regression and outputs.shape[1] == 2:
        return np.log(np.exp(stacked.astype(np.float64)).mean(axis=0)).astype(np.float32)
    return stacked.mean(axis=0)


def predicted(outputs: np.ndarray, task: TaskSpec) -> np.ndarray:
    """The predictions from the model's outputs: the STS-B score, or the class with the largest logit. A cloze head's
    regression outputs are the poles' log-probabilities: the score is lb + (ub - lb) P(high), as LM-BFF's."""
    if task.is_regression and outputs.shape[1] == 2:
        low, high = task.label_range
        return np.exp(outputs[:, 1]) * (high - low) + low
    return outputs[:, 0] if task.is_regression else outputs.argmax(axis=1)


def _evaluation_pieces(sets: list[EvaluationSet], i: int, group: GroupSettings) -> list[list[np.ndarray | None]]:
    """Every member's i-th chunk (None where it has none left), in one pass or in length-sorted pieces
    (`length_cuts`)."""
    parts = [s.batches[i] if i < len(s.batches) else None for s in sets]
    lengths = [s.lengths[i] if i < len(s.batches) else [] for s in sets]
    cuts = length_cuts(lengths, group)
    if cuts is None:
        return [parts]
    return [[p[:, start:stop, : l[min(stop, len(l)) - 1]] if p is not None and start < len(l)
             else None for p, l in zip(parts, lengths)] for start, stop in zip([0, *cuts], cuts)]


def _stack_blocks(parts: list[np.ndarray | None], pad_id: int, device: torch.device) -> tuple[dict, list[int]]:
    """One batch from each member's chunk (None: it has no rows left), every block padded to the same rows and
    width, built on the host and copied to the device at once; `real` marks the rows that count, and the sizes say
    how many each member has. A block with fewer rows repeats its first row; a member without rows takes the first
    present member's."""
    present = [p for p in parts if p is not None]
    rows = max(p.shape[1] for p in present)
    width = max(p.shape[2] for p in present)
    block = np.zeros((3, len(parts) * rows, width), dtype=np.int64)  # input ids, attention mask, token types
    block[0] = pad_id
    real = np.zeros(len(parts) * rows, dtype=bool)
    sizes = []
    for position, part in enumerate(parts):
        source = present[0] if part is None else part
        n, w = source.shape[1], source.shape[2]
        target = block[:, position * rows : (position + 1) * rows]
        target[:, :n, :w] = source
        target[:, n:] = target[:, :1]  # filler rows: the block's first
        size = 0 if part is None else n
        real[position * rows : position * rows + size] = True
        sizes.append(size)
    block, real = torch.from_numpy(block), torch.from_numpy(real)
    if device.type == "cuda":  # asynchronous copies
        block, real = block.pin_memory(), real.pin_memory()
    input_ids, attention_mask, token_type_ids = block.to(device, non_blocking=True).unbind(0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
            "real": real.to(device, non_blocking=True)}, sizes


def _epoch_metrics(loss: float, scores: dict, lr: float, seconds: float, gates: dict | None) -> dict:
    metrics = {"train_loss": loss, **{f"dev_{k}": v for k, v in scores.items() if k != "main"}, "lr": lr,
               "epoch_seconds": seconds}
    for submodule, values in (gates or {}).items():
        metrics[f"gate_{submodule}"] = float(np.nanmean(values))
    return metrics


def _log_epoch(members, active, epoch, losses, scores, seconds, task) -> None:
    if len(members) == 1:
        member = members[0]
        if member.settings.eval_every is not None:
            every = member.settings.eval_every
            log.info("step %d/%d  loss %.4f  dev %s %s  (best %s at step %d)  %.1fs", epoch * every,
                     member.settings.steps, losses[0], task.main_metric, _fmt(scores[0]["main"]),
                     _fmt(member.dev_best.get("main")), member.best_epoch * every, seconds)
            return
        log.info("epoch %d/%d  loss %.4f  dev %s %s  (best %s at epoch %d)  %.1fs", epoch, member.settings.epochs,
                 losses[0], task.main_metric, _fmt(scores[0]["main"]), _fmt(member.dev_best.get("main")),
                 member.best_epoch, seconds)
        return
    values = [s["main"] for s in scores if s["main"] is not None]
    spread = f"{min(values):.2f}..{max(values):.2f}" if values else "n/a"
    every = members[0].settings.eval_every  # a group's members share train.* (peltbench.fusion)
    where = f"step {epoch * every}/{members[0].settings.steps}" if every is not None else f"epoch {epoch}"
    log.info("%s  %d of %d runs training  loss %.4f..%.4f  dev %s %s  %.1fs", where, len(active), len(members),
             min(losses), max(losses), task.main_metric, spread, seconds)


def _autocast(group: GroupSettings):
    if group.bf16:
        return torch.autocast(device_type=group.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _now(device: torch.device) -> float:
    """Wall time, after the device has finished the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _fmt(score) -> str:
    return "n/a" if score is None or score == -math.inf else f"{score:.2f}"
