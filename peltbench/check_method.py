"""`peltbench-check-method METHOD`: hold a method's components to the contract every built-in is held to.

    peltbench-check-method lora
    peltbench-check-method my_lora --config-dir ~/mylab/conf          (~/mylab/conf/method/my_lora.yaml)
    peltbench-check-method my_lora hydra.searchpath=[file://$HOME/mylab/conf] method.lora_rank=4

METHOD is composed as `peltbench method=METHOD` composes it (a packaged method, or a method YAML in a config folder
that `--config-dir DIR` or `hydra.searchpath=[file://DIR]` adds), with any `method.KEY=VALUE` given, then trained and
inspected through peltbench's own code (the runner, the training loop, saving and `load_run`) on a tiny random encoder
of each supported family (peltbench.tiny: BERT, RoBERTa, DeBERTa-v3, ELECTRA, ModernBERT; hidden 32, 2 layers, O(1)
weights, dropout 0.1, a tokenizer saved beside) and a small sentiment task (peltbench.tiny.write_sentiment_task):

  trains    the train loss falls (at the method's learning rate or 10 or 100 times it, `--lr` one rate instead, on the
            encoder with dropout off), and every tensor it trains moves;
  fused     a member's record (every epoch's train loss and dev score, its test scores) equals its run alone, fused
            with another seed of itself and with other methods (lora, adapter, prefix, bitfit), dropout on; where it
            does not, a probe says what lets the members see each other (a shared tensor, a batch statistic);
  slot      its initial weights do not depend on its slot in a group, nor on the members beside it;
  seed      its drawn initial weights depend on the run's model seed (not on a generator of its own);
  backbone  the pretrained backbone stays frozen and unchanged: a member without components beside it computes the
            pretrained model's logits before and after training steps, and every tensor nothing trains stays equal;
  count     its parameter counts agree where they are made (the meta device, as `peltbench-params` and the record
            count, and the model) and with the optimiser; every Parameter it adds is trained (marked) or declared frozen;
            what a module says it stores (stored_numel) is what it stores;
  device    alone and fused under bf16 autocast with a GPU's batch shapes, inside the host-tensor net
            (peltbench.devicecheck; on a CUDA machine, on the GPU itself): no tensor made on the host meets the device;
  reload    its saved weights reload (`peltbench.load_run`) and predict its test rows as the run did.

One line per check, PASS or FAIL with its reason on every encoder (SKIP where a check cannot apply: fine-tuning trains
alone and trains the backbone); exit status 0 when no check fails, 1 when one fails, 2 for a METHOD or setting that
cannot be checked (one line on stderr, before any run: docs/check-method.md).
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from . import UserError
from .packaged import use_searchpath

CHECKS = ("trains", "fused", "slot", "seed", "backbone", "count", "device", "reload")
COMPANIONS = ("lora", "adapter", "prefix", "bitfit")  # the built-ins a member is fused with (docstring: fused)
EPOCHS = 4           # of 4 steps each (k=32, batch 8): 16 steps
BATCH = 8
LR_FACTORS = (1, 10, 100)  # `trains`: the method's learning rate times these (a tiny model learns at larger rates)
FALL = 0.9           # `trains`: the last epoch's train loss at most this share of the first's
RELATIVE = 1e-5      # `fused`: train losses fused and alone to float rounding (tests/conftest.assert_trained_alike)
ABSOLUTE = 1e-6      # `fused`: dev and test scores; `reload`: test scores
FOUND = "found: "    # `fused`: what lets the members see each other, as a probe found it (_what_members_share)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # a model's inputs, in the order PeltModel takes them
MOVED = 0.02         # `fused`'s probe moves every trained tensor off its init, `seed` the backbone, by N(0, this²)
DRAWN_VALUES = 2     # `seed`: a tensor with more distinct values than this, the same under two model seeds, was drawn
SCALE = 1e-5         # `backbone`: logits computed two ways, to this share of their scale
TASK_ROWS = {"k": 32, "dev_size": 16}
NAME_MAX = 255       # bytes of a file name (a run folder's), on the file systems peltbench runs on
ALONE = "it trains alone (peltbench.fusion keeps it out of every group, as fine-tuning)"
USAGE = "peltbench-check-method METHOD [method.KEY=VALUE ...] [--config-dir DIR | hydra.searchpath=[file://DIR]]"


@dataclass
class Verdict:
    """One check's outcome over the encoders: its failures ("encoder: reason"), what passed ((encoder, what, detail)),
    or why it was skipped (and on which encoders)."""

    check: str
    passed: list[tuple[str, str, str | None]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    note: str | None = None  # said after what passed (the count on bert-base-uncased's shape)
    skipped_on: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "FAIL" if self.failures else "PASS" if self.passed else "SKIP"

    def line(self) -> str:
        """One line: a FAIL names every encoder's failure and the encoders it passed or skipped on (a crash on one
        encoder hides none of the others)."""
        if self.failures:
            others = [f"passed on {', '.join(encoder for encoder, _, _ in self.passed)}"] if self.passed else []
            if self.skipped_on:
                others.append(f"skipped on {', '.join(self.skipped_on)} ({'; '.join(self.skipped)})")
            return f"FAIL  {self.check:<9} {'; '.join([*self.failures, *others])}"
        if not self.passed:
            return f"SKIP  {self.check:<9} {'; '.join(self.skipped)}"
        said = "; ".join(dict.fromkeys(what for _, what, _ in self.passed))
        details = [f"{encoder}: {detail}" if detail else encoder for encoder, _, detail in self.passed]
        note = f"; {self.note}" if self.note else ""
        return f"PASS  {self.check:<9} {said} ({'; '.join(details)}){note}"


class CheckFailed(Exception):
    """A check's failure on one encoder: its reason, one line."""


# ---------------------------------------------------------------- composing the method as `peltbench` does


@dataclass
class Request:
    """What to check: the method's name, the config folders Hydra searches beside peltbench's, `method.KEY=VALUE`s."""

    method: str
    search: list[str] = field(default_factory=list)   # file://DIR entries (hydra.searchpath)
    settings: list[str] = field(default_factory=list)  # method.KEY=VALUE overrides
    lr: float | None = None                            # the runs' learning rate instead of the method's
    encoders: list[str] = field(default_factory=lambda: _families())  # the tiny encoders to check on
    keep: str | None = None                            # a folder that keeps what the checks made

    def overrides(self) -> list[str]:
        search = [f"hydra.searchpath=[{','.join(self.search)}]"] if self.search else []
        return [f"method={self.method}", *search, *self.settings]


class Composer:
    """Composes configs as the `peltbench` command does (Hydra's config loader on peltbench.conf, the request's search
    path added): each set of overrides once in a process (the files it reads stay as they were), a copy for each
    call."""

    _composed: dict[tuple, DictConfig] = {}

    def __init__(self, search: Sequence[str] = ()) -> None:
        self.search = list(search)
        use_searchpath(self.search)  # the user's method files: what their runs' folders name (packaged.py)

    def __call__(self, *overrides: str) -> DictConfig:
        key = (tuple(self.search), tuple(overrides))
        if key not in self._composed:
            self._composed[key] = self._compose(list(overrides))
        return copy.deepcopy(self._composed[key])

    def _compose(self, overrides: list[str]) -> DictConfig:
        from hydra import compose, initialize_config_module
        from hydra.core.global_hydra import GlobalHydra
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from .cli import one_line

        search = [f"hydra.searchpath=[{','.join(self.search)}]"] if self.search else []
        GlobalHydra.instance().clear()  # composing inside a process that already runs Hydra (the tests)
        with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
            try:
                cfg = compose(config_name="config", overrides=[*search, *overrides])
            except (HydraException, OmegaConfBaseException, ValueError) as error:
                raise UserError(one_line(error, overrides)) from None
        with_hydra = OmegaConf.to_container(cfg)
        with_hydra.pop("hydra", None)
        return OmegaConf.create(with_hydra)


def parse(argv: Sequence[str]) -> Request:
    """The command line as a Request; UserError (one line) for what cannot be checked."""
    parser = argparse.ArgumentParser(prog="peltbench-check-method", usage=USAGE, description=__doc__.splitlines()[0])
    parser.add_argument("method", help="a packaged method (peltbench --help lists them), or the name of a method YAML "
                                       "in your config folder (DIR/method/NAME.yaml), or that file's path")
    parser.add_argument("overrides", nargs="*", help="method.KEY=VALUE settings; hydra.searchpath=[file://DIR]")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="a config folder with your method YAML in DIR/method/ (as hydra.searchpath=[file://DIR])")
    parser.add_argument("--encoders", default=",".join(_families()),
                        help=f"the tiny encoders to check on, comma-separated (default: all: {','.join(_families())})")
    parser.add_argument("--lr", type=float, default=None,
                        help="the learning rate of the runs (default: the method's own)")
    parser.add_argument("--keep", metavar="DIR", help="keep the checkpoints, data and records the checks made in DIR")
    args = parser.parse_intermixed_args(argv)  # settings before or after the options
    search = [_folder(directory) for directory in args.config_dir]
    name = args.method
    if name.endswith((".yaml", ".yml")):  # a method file's path: its config folder is the folder above method/
        path = Path(name).expanduser().resolve()
        if path.parent.name != "method" or not path.is_file():
            raise UserError(f"{name}: a method YAML is found as Hydra finds it, in a folder named method/ of your config "
                            f"folder (DIR/method/NAME.yaml; then --config-dir DIR NAME)")
        search.append(_folder(str(path.parent.parent)))
        name = path.stem
    settings = []
    for override in args.overrides:
        key = override.partition("=")[0].lstrip("+~")
        if key == "hydra.searchpath":
            search += [entry.strip() for entry in override.partition("=")[2].strip("[]").split(",") if entry.strip()]
        elif key.startswith("method.") and "=" in override:
            settings.append(override)
        else:
            raise UserError(f"{override}: only method.KEY=VALUE settings and hydra.searchpath=[file://DIR] are taken "
                            f"(the checks choose the task, model, data and training themselves)")
    for entry in search:
        if entry.startswith("file://") and not Path(entry[7:]).is_dir():
            raise UserError(f"hydra.searchpath: {entry}: no such folder")
    return Request(name, search, settings, args.lr, _encoders(args.encoders), args.keep)


def _folder(directory: str) -> str:
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise UserError(f"--config-dir {directory}: no such folder")
    return f"file://{path}"


def _families() -> list[str]:
    from .tiny import ENCODERS

    return list(ENCODERS)


def _encoders(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in _families()]
    if unknown or not chosen:
        raise UserError(f"--encoders {text}: choose from {','.join(_families())}")
    return chosen


# ---------------------------------------------------------------- the checks' setting: tiny encoders, a small task


@dataclass
class Bench:
    """Where the checks run on one encoder: its checkpoint, the task's files, a results folder, and how configs are
    composed."""

    encoder: str
    checkpoint: Path
    data: Path
    quiet: Path  # the same encoder with dropout off: `trains` reads its loss without dropout's noise
    results: Path
    compose: Composer

    def run_config(self, method: str, settings: Sequence[str] = (), seed: int = 111, model_seed: int = 42,
                   **changes) -> DictConfig:
        """A run of `method` on this encoder and task (k=32, 4 epochs of 4 steps, no early stop, fp32 on the CPU): the
        method composed with its settings, the run's values set as `KEY=VALUE` overrides set them."""
        cfg = self.compose(*method_overrides(method, settings))
        values = {"model.name": str(self.checkpoint), "data.dir": str(self.data), **TASK_ROWS, "train.epochs": EPOCHS,
                  "train.patience": EPOCHS, "train.batch_size": BATCH, "device": "cpu", "precision": "fp32",
                  "seed": seed, "model_seed": model_seed, "results_dir": str(self.results), **changes}
        for key, value in values.items():
            OmegaConf.update(cfg, key, value, merge=False)
        return cfg


def make_bench(encoder: str, root: Path, compose: Composer) -> Bench:
    from .tiny import save_tiny_encoder, write_sentiment_task

    data = root / "data"
    if not (data / "SST-2").is_dir():
        write_sentiment_task(data)
    checkpoint = root / "tiny" / encoder  # model.name=tiny_<encoder> in the runs' folder names
    quiet = root / "tiny0" / encoder
    for folder, dropout in ((checkpoint, 0.1), (quiet, 0.0)):
        if not (folder / "config.json").is_file():
            save_tiny_encoder(encoder, folder, dropout=dropout)
    (root / "runs").mkdir(exist_ok=True)  # a new folder each time: no run is found done by an earlier check
    results = Path(tempfile.mkdtemp(prefix=f"{encoder}-", dir=root / "runs"))
    return Bench(encoder, checkpoint, data, quiet, results, compose)


# ---------------------------------------------------------------- the checks on one encoder


@dataclass
class Subject:
    """The method under check on one bench: its composed run (seed 111, model seed 42), and what the checks share."""

    request: Request
    bench: Bench
    cfg: DictConfig
    alone: dict | None = None       # the record of its run alone (fused, reload), once run
    run_dir: Path | None = None


def trains_alone(subject: Subject) -> bool:
    """Whether fusion keeps the method out of every group (fine-tuning: it trains the backbone itself)."""
    from .fusion import group_key

    return group_key(_fused_run(subject.cfg, subject.bench, "fused")) is None


def check_trains(subject: Subject) -> tuple[str, str | None]:
    """At the method's learning rate and 10 and 100 times it (or `--lr`), fused where fusion allows, on the encoder with
    dropout off (with it, an epoch's loss moves by up to 8 % between epochs where nothing trains): at one of them the
    train loss falls, and every tensor it trains there (but the head) moves."""
    from .fusion import plan_groups
    from .runner import group_model, run_group
    from .saving import member_weights, read_weights

    cfg, bench = subject.cfg, subject.bench
    rates = [float(cfg.method.lr)] if subject.request.lr is not None else [float(cfg.method.lr) * f for f in LR_FACTORS]
    cfgs = [_trains_run(cfg, bench, lr) for lr in rates]
    outcomes = [outcome for group in plan_groups(cfgs) for outcome in run_group([cfgs[i] for i in group])]
    tried = []
    for lr, outcome in zip(rates, outcomes):
        if outcome.status != "ok":
            tried.append((math.inf, lr, f"lr {lr:g}: {_error(outcome)}", None))
            continue
        losses = [entry["train_loss"] for entry in outcome.record["history"]]
        fall = losses[-1] / losses[0] if math.isfinite(losses[-1]) and losses[0] > 0 else math.inf
        tried.append((fall, lr, f"lr {lr:g}: {_losses(losses)}", outcome.record))
    fall, lr, said, record = min(tried, key=lambda entry: entry[0])
    if not fall <= FALL:
        raise CheckFailed(f"the train loss did not fall to {FALL:g} × its first epoch's in {EPOCHS} epochs at any "
                          f"learning rate tried ({'; '.join(entry[2] for entry in tried)})")
    model = group_model([_trains_run(cfg, bench, lr)], _task(cfg), _cpu())
    initial = member_weights(model, 0, cfg.method, model.config)
    trained, _ = read_weights(_run_dir(bench.results / "trains", record))
    own = [name for name in initial if name not in _head_names(model)]
    still = [name for name in own if _equal(initial[name], trained[name])]
    if still:
        raise CheckFailed(f"at lr {lr:g} the loss fell ({said}) but {len(still)} of the {len(own)} tensors it trains "
                          f"never moved: {_names(still)} (no gradient reaches them?)")
    if not own:
        return "the train loss falls (it trains the head only)", said
    return "the train loss falls, and every tensor it trains moves", f"{said}, {len(own)} tensors"


def check_fused(subject: Subject) -> tuple[str, str | None]:
    """The run fused with another seed of itself and the companions, dropout on: its record equals its run alone."""
    from .fusion import plan_groups
    from .runner import run_group

    record = _alone(subject)
    bench = subject.bench
    cfgs = [_fused_run(cfg, bench, "fused") for cfg in (subject.cfg, _other_seed(subject), *_companions(subject))]
    group = next(group for group in plan_groups(cfgs) if 0 in group)
    if len(group) == 1:
        raise Skip(ALONE)
    outcomes = run_group([cfgs[i] for i in group])
    bad = [(cfgs[i].method.name, o) for i, o in zip(group, outcomes) if o.status != "ok"]
    if bad:
        name, outcome = bad[0]
        raise CheckFailed(f"the fused group of {len(group)} failed: {name}: {_error(outcome)}")
    fused = outcomes[0].record
    if (fused.get("fused") or {}).get("size") != len(group):
        raise CheckFailed(f"it did not train fused (record `fused`: {fused.get('fused')})")
    difference = _record_difference(record, fused)
    if difference:
        shared = _what_members_share([cfgs[i] for i in group], bench)
        raise CheckFailed(f"fused with {_members(cfgs, group)}, its record differs from its run alone: {difference}"
                          f"{f'; {FOUND}{shared}' if shared else ''}")
    return f"its record equals its run alone's, fused with {_members(cfgs, group)}, dropout on", None


def _what_members_share(cfgs: list[DictConfig], bench: Bench) -> str | None:
    """Where a fused member's record differs from its run alone, what lets the members see each other, where a probe
    finds it: the group built as `cfgs` on the encoder without dropout, every trained tensor moved off its init (a
    delta that starts at zero hides what it reads), in training mode, every member given the same rows. A member
    whose logits change when the other members' rows change (something computed over every member's rows: a batch
    statistic); else a member whose loss has a gradient in another member's slot of a tensor (a tensor the members
    share); else a buffer a forward pass changes (a statistic kept across batches). None where none is found."""
    from .runner import group_model

    runs = [copy.deepcopy(cfg) for cfg in cfgs]
    for run in runs:
        run.model.name = str(bench.quiet)
    model = group_model(runs, _task(runs[0]), _cpu())
    _move(parameter for _, parameter, _, _ in model.member_parameters())
    model.train()
    names = [run.method.name if i else f"{run.method.name} (the method checked)" for i, run in enumerate(runs)]
    buffers = {name: tensor.detach().clone() for name, tensor in model.named_buffers()}
    same, other = _two_batches(bench)
    logits = model(*(_repeat(same[key], len(runs)) for key in INPUTS))
    # the rows first: another member's rows reach a member's logits through every slot of the layers above them too
    found = _rows_seen(model, logits, same, other, names) or _slots_reached(model, logits, names)
    written = [name for name, tensor in model.named_buffers() if name in buffers and not _equal(tensor, buffers[name])]
    if found is None and written:
        found = f"a forward pass changes {_names(written)}: a statistic the members share?"
    return found


def _move(parameters) -> None:
    """Each of `parameters` moved by N(0, MOVED²), a fixed draw."""
    import torch

    draw = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in parameters:
            parameter.add_(torch.randn(parameter.shape, generator=draw, dtype=parameter.dtype) * MOVED)


def _rows_seen(model, logits, same: dict, other: dict, names: list[str]) -> str | None:
    """A member whose logits change when every other member's rows change (`same` → `other`)."""
    import torch

    count, rows = len(names), same["input_ids"].shape[0]
    with torch.no_grad():
        for member in range(count):
            mine = slice(member * rows, (member + 1) * rows)
            changed = model(*(_member_rows(same[key], other[key], member, count) for key in INPUTS))[mine]
            difference = float((changed - logits[mine]).abs().max())
            if not difference <= SCALE * max(float(logits.abs().max()), 1.0):
                return (f"the logits of member {member} ({names[member]}) change by {difference:.3g} when the other "
                        f"members' rows change: something is computed over every member's rows (a batch statistic?)")
    return None


def _slots_reached(model, logits, names: list[str]) -> str | None:
    """A member whose logits have a gradient in another member's slot of a trained tensor."""
    import torch

    count, rows = len(names), logits.shape[0] // len(names)
    trained = model.member_parameters()
    for member in range(count):
        grads = torch.autograd.grad(logits[member * rows : (member + 1) * rows].sum(), [p for _, p, _, _ in trained],
                                    retain_graph=True, allow_unused=True)
        for (name, _, _, stacked), grad in zip(trained, grads):
            reached = [] if grad is None or not stacked else \
                [slot for slot in range(count) if slot != member and bool(grad[slot].abs().max() > 0)]
            if reached:
                return (f"the loss of member {member} ({names[member]}) has a gradient in member {reached[0]}'s slot "
                        f"of {model.stored_name(name)} ({names[reached[0]]}'s): its members share that tensor")
    return None


def _member_rows(same, other, member: int, count: int):
    """`same`'s rows for `member`, `other`'s for every other member, member after member."""
    import torch

    return torch.cat([same if m == member else other for m in range(count)])


def _two_batches(bench: Bench):
    """Two sets of six rows of the task, padded to one width: (the first's inputs, the second's)."""
    inputs, _ = _batch(bench, 12)
    return ({key: value[:6] for key, value in inputs.items()}, {key: value[6:] for key, value in inputs.items()})


def check_slot(subject: Subject) -> tuple[str, str | None]:
    """Built in a group, after the companions that fusion lets beside it and another seed of itself, and before the
    others: its initial tensors, trained and frozen (`frozen_state`), equal its run alone's, exactly."""
    from .methods import member_frozen
    from .runner import group_model
    from .saving import member_weights

    task, cfg = _task(subject.cfg), subject.cfg
    if trains_alone(subject):
        raise Skip(ALONE)
    alone = group_model([cfg], task, _cpu())
    expected = {**member_weights(alone, 0, cfg.method, alone.config), **member_frozen(alone, 0, cfg.method)}
    others = _companions(subject)
    cfgs = [*others[:2], _other_seed(subject), cfg, *others[2:]]
    slot = len(others[:2]) + 1
    group = group_model(cfgs, task, _cpu())
    found = {**member_weights(group, slot, cfg.method, group.config), **member_frozen(group, slot, cfg.method)}
    differing = [name for name in expected if name not in found or not _equal(found[name], expected[name])]
    if differing:
        raise CheckFailed(f"in slot {slot} of a group of {len(cfgs)} its initial {_names(differing)} differ from its "
                          f"run alone's (a draw that depends on the slot or on the members beside it?)")
    return f"its initial tensors equal its run alone's in slot {slot} of a group of {len(cfgs)}", f"{len(expected)} tensors"


def check_seed(subject: Subject) -> tuple[str, str | None]:
    """Built alone under model seeds 42 and 43, the tensors it starts from (those it trains, but the head, and its
    `frozen_state`) differ wherever they are drawn: the run's model seed draws every component (peltbench seeds
    torch's generator before each component's `init_member`). A tensor the same under both seeds is not drawn where
    it has at most DRAWN_VALUES distinct values (zeros, ones, a constant) or changes with the backbone's weights (DoRA's
    magnitudes, PiSSA's factors); otherwise it was drawn from a generator of the component's own."""
    cfg = subject.cfg
    initial = _initial_tensors(cfg, subject.bench)
    if not initial:
        return "it trains the head only (drawn from the model seed)", None
    other = copy.deepcopy(cfg)
    other.model_seed = 43
    drawn = _initial_tensors(other, subject.bench)
    same = [name for name in initial if _equal(initial[name], drawn[name])]
    looks_drawn = [name for name in same if _distinct(initial[name]) > DRAWN_VALUES]
    if looks_drawn:
        moved = _initial_tensors(cfg, subject.bench, moved=True)
        fixed = [name for name in looks_drawn if _equal(initial[name], moved[name])]
        if fixed:
            raise CheckFailed(f"its initial {_names(fixed)} are the same under model seeds 42 and 43, and do not "
                              f"follow the backbone's weights: drawn from a generator of its own? The run's model "
                              f"seed draws every component (docs/components.md: draw with base.draw)")
    if len(same) == len(initial):
        return "nothing it starts from is drawn", f"its {len(initial)} tensors start at constants or the checkpoint's"
    return "its drawn tensors follow the model seed", \
        f"{len(initial) - len(same)} of {len(initial)} tensors differ between model seeds 42 and 43"


def _initial_tensors(cfg: DictConfig, bench: Bench, moved: bool = False) -> dict:
    """The tensors the method's member starts from, built alone: those it trains (but the head) and its
    `frozen_state`. `moved`: on the backbone with every weight moved a little (a fixed draw: `_move`)."""
    from .methods import build_pelt_model, member_frozen
    from .model import initial_head, load_backbone
    from .saving import member_weights

    task = _task(cfg)
    backbone = load_backbone(str(cfg.model.name), task.num_labels, cfg.model_seed)
    if moved:
        _move(backbone.parameters())
    model = build_pelt_model(backbone, cfg.method, cfg.model_seed,
                             [initial_head(str(cfg.model.name), task.num_labels, cfg.model_seed)])
    head = _head_names(model)
    trained = {name: tensor for name, tensor in member_weights(model, 0, cfg.method, model.config).items()
               if name not in head}
    return {**trained, **member_frozen(model, 0, cfg.method)}


def _distinct(tensor) -> int:
    import torch

    return int(torch.unique(tensor.detach().float().cpu()).numel())


def check_backbone(subject: Subject) -> tuple[str, str | None]:
    """Built, every pretrained tensor under its own name equals the checkpoint's; trained a few steps, every parameter
    and buffer nothing trains is unchanged, bit for bit; and a member with no components (and a frozen head) beside
    it, where fusion allows one, computes the pretrained model's logits before and after."""
    import torch

    from .fusion import group_key
    from .methods import after_step, plan_training, regulariser
    from .model import load_backbone
    from .runner import group_model
    from .train import MemberAdamW

    cfg = subject.cfg
    task = _task(cfg)
    plain = copy.deepcopy(cfg)
    plain.method = OmegaConf.create({"name": "no_components", "components": [], "head": "frozen", "lr": 0.0})
    plain.model_seed = 77
    beside = group_key(_fused_run(plain, subject.bench, "x")) == group_key(_fused_run(cfg, subject.bench, "x"))
    cfgs = [cfg, plain] if beside else [cfg]
    model = group_model(cfgs, task, _cpu())
    if model.unstacked:  # only a component declared `alone` may (methods.base.check_marks refuses the others)
        raise Skip(f"it trains the backbone's own tensors ({len(model.unstacked)} of them) and trains alone, as its "
                   f"declaration says (`alone`), as fine-tuning")
    reference = load_backbone(str(cfg.model.name), task.num_labels, plain.model_seed).eval()
    differing = _differing_from_pretrained(model, reference)
    if differing:
        raise CheckFailed(f"once built, {len(differing)} pretrained tensors differ from the checkpoint's: "
                          f"{_names(differing)}")
    inputs, labels = _batch(subject.bench)
    if beside:
        _same_as_pretrained(model, reference, inputs, "once built")
    trained = {name for name, _, _, _ in model.member_parameters()}
    before = {name: tensor.detach().clone() for name, tensor in [*model.named_parameters(), *model.named_buffers()]
              if name not in trained}
    optimizer = MemberAdamW(model)
    steps, members = 3, len(cfgs)
    optimizer.schedule(0, 1e-2, steps)
    plan_training(model, [steps] * members)
    model.train()
    rows = inputs["input_ids"].shape[0]
    for step in range(steps):
        logits = model(*(_repeat(inputs[key], members) for key in INPUTS))
        loss = torch.nn.functional.cross_entropy(logits, labels.repeat(members), reduction="none")
        loss = loss.view(members, rows).mean(1)
        extra = regulariser(model)
        (loss if extra is None else loss + extra).sum().backward()
        optimizer.clip(torch.ones(members))
        optimizer.step(step)
        after_step(model, step)
        optimizer.zero_grad()
    changed = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()]
               if name in before and not _equal(tensor, before[name])]
    if changed:
        raise CheckFailed(f"{len(changed)} tensors nothing trains changed in {steps} training steps: {_names(changed)}")
    if beside:
        _same_as_pretrained(model, reference, inputs, f"after {steps} training steps")
        return ("its pretrained tensors are the checkpoint's, nothing untrained moves in training, and a member "
                "without components beside it computes the pretrained model before and after"), None
    return "its pretrained tensors are the checkpoint's, and nothing untrained moves in training", None


def check_count(subject: Subject) -> tuple[str, str | None]:
    """Its counts on the meta device (peltbench-params, and the runner for the record) and on the model agree, and the
    optimiser updates what they count; requires_grad is on what `mark` marked; every Parameter it adds is trained by
    its member or declared frozen (`frozen_state`)."""
    from .methods import build_pelt_model, count_method, member_frozen, parameter_counts
    from .methods.base import MemberBias, MemberLayerNorm
    from .model import initial_head, load_backbone
    from .train import MemberAdamW

    cfg, task = subject.cfg, _task(subject.cfg)
    backbone = load_backbone(str(cfg.model.name), task.num_labels, cfg.model_seed)
    originals = list(backbone.parameters())  # held, so that no new Parameter takes a dropped one's id (the head's)
    pretrained = {id(parameter) for parameter in originals}  # what the built model keeps of them is the checkpoint's
    model = build_pelt_model(backbone, cfg.method, cfg.model_seed,
                             [initial_head(str(cfg.model.name), task.num_labels, cfg.model_seed)])
    counts = parameter_counts(model)
    try:
        meta = count_method(cfg.method, model.config)
    except Exception as error:  # noqa: BLE001 - a component that cannot be built on the meta device
        raise CheckFailed(f"it cannot be counted on the meta device as peltbench-params counts it "
                          f"({type(error).__name__}: {_first_line(error)})") from None
    if meta != counts:
        raise CheckFailed(f"counted on the meta device {_counted(meta)}, on the model {_counted(counts)}")
    optimised = _optimised_numel(MemberAdamW(model), 0)
    if optimised != counts["optimizer_params"]:
        raise CheckFailed(f"the optimiser updates {optimised:,} parameters, the count says {counts['optimizer_params']:,}")
    grad = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    marked = {name for name, _, _, _ in model.member_parameters()}
    if grad != marked:
        raise CheckFailed(f"requires_grad set outside `mark`: {_names(sorted(grad ^ marked))}")
    affine = {id(p) for module in model.modules() if isinstance(module, (MemberBias, MemberLayerNorm))
              for p in module.parameters(recurse=False)}
    frozen = set(member_frozen(model, 0, cfg.method))
    idle = [name for name, parameter in model.named_parameters()
            if name not in marked and not name.startswith("head.") and id(parameter) not in pretrained | affine
            and model.stored_name(name) not in frozen]
    del originals
    if idle:
        raise CheckFailed(f"{len(idle)} Parameters it adds train for no member and are not declared frozen "
                          f"(frozen_state): {_names([model.stored_name(name) for name in idle])}: left out of "
                          f"`mark`? (a tensor meant to stay fixed is a buffer, or declared by the component's "
                          f"frozen_state)")
    return ("its counts agree on the meta device, on the model and in the optimiser; every Parameter it adds trains "
            "or is declared frozen"), (f"{counts['trainable_params']:,} stored ({counts['head_params']:,} head, "
                                       f"{counts['optimizer_params']:,} optimised)")


def check_device(subject: Subject) -> tuple[str, str | None]:
    """Alone (saved, reloaded, rescored) and fused, under bf16 autocast with a GPU's batch shapes inside the host-tensor
    net (on a CUDA machine: on the GPU, the net beside it)."""
    import peltbench

    from .devicecheck import DeviceFault
    from .fusion import plan_groups
    from .runner import run_group

    bench, cfg = subject.bench, subject.cfg
    alone = _device_run(cfg, bench, "device-alone", **{"save.weights": True})
    cfgs = [_device_run(cfg, bench, "device-fused", fuse=True)
            for cfg in (subject.cfg, _other_seed(subject), *_companions(subject))]
    group = next(group for group in plan_groups(cfgs) if 0 in group)
    with on_a_gpu() as (device, check):
        try:
            [outcome] = run_group([alone])
            _device_ok(outcome, check, "alone")
            [run_dir] = {path.parent for path in (bench.results / "device-alone").rglob("result.json")}
            loaded = peltbench.load_run(run_dir)
            scores, _ = loaded.predict()
            if not _scores_equal(scores, outcome.record["test"]):
                raise CheckFailed(f"reloaded in bf16 it scores {scores}, where its run scored {outcome.record['test']}")
            if len(group) > 1:
                for outcome in run_group([cfgs[i] for i in group]):
                    _device_ok(outcome, check, f"fused with {_members(cfgs, group)}")
        except DeviceFault as fault:
            raise CheckFailed(f"{fault}") from None
        if check.faults:
            raise CheckFailed(check.faults[0])
    where = "on cuda" if device == "cuda" else "on the CPU as on a GPU"
    return f"bf16 {where}, alone, reloaded{' and fused' if len(group) > 1 else ''}: no host tensor met the device", None


def check_reload(subject: Subject) -> tuple[str, str | None]:
    """Its saved run (weights.safetensors) reloads with peltbench.load_run and predicts as the run did."""
    import peltbench

    record = _alone(subject)
    loaded = peltbench.load_run(subject.run_dir)
    scores, predictions = loaded.predict()
    if not _scores_equal(scores, record["test"]):
        raise CheckFailed(f"reloaded it scores {scores} where its run scored {record['test']}")
    with open(subject.run_dir / "predictions.csv") as handle:
        saved = [row["prediction"] for row in csv.DictReader(handle)]
    mismatched = sum(str(a) != b for a, b in zip(predictions.tolist(), saved)) + abs(len(saved) - len(predictions))
    if mismatched:
        raise CheckFailed(f"reloaded, {mismatched} of its {len(saved)} test predictions differ from the run's "
                          f"predictions.csv")
    return f"reloaded, it predicts its {len(saved)} test rows and scores as its run did", None


class Skip(Exception):
    """A check that cannot apply to this method (its reason)."""


# ---------------------------------------------------------------- helpers of the checks


def _alone(subject: Subject) -> dict:
    """The method's run alone (seed 111, model seed 42), saved with its weights and predictions: trained once."""
    from .runner import run_group

    if subject.alone is None:
        cfg = copy.deepcopy(subject.cfg)
        cfg.results_dir = str(subject.bench.results / "alone")
        cfg.save.weights = cfg.save.predictions = True
        [outcome] = run_group([cfg])
        if outcome.status != "ok":
            raise CheckFailed(f"its run alone failed: {_error(outcome)}")
        subject.alone = outcome.record
        subject.run_dir = _run_dir(subject.bench.results / "alone", outcome.record)
    return subject.alone


def _run_dir(results: Path, record: dict) -> Path:
    """The folder of the run whose record is `record`, under `results`."""
    import json

    [found] = {path.parent for path in results.rglob("result.json")
               if json.loads(path.read_text()).get("config_hash") == record.get("config_hash")}
    return found


def _other_seed(subject: Subject) -> DictConfig:
    cfg = copy.deepcopy(subject.cfg)
    cfg.seed, cfg.model_seed = 222, 43
    return cfg


def _trains_run(cfg: DictConfig, bench: Bench, lr: float) -> DictConfig:
    """The method's run in `trains`: at `lr`, on the encoder without dropout, fused, its weights saved."""
    run = copy.deepcopy(cfg)
    run.method.lr, run.fuse, run.results_dir, run.model.name = lr, True, str(bench.results / "trains"), str(bench.quiet)
    run.save.weights = True
    return run


def _companions(subject: Subject) -> list[DictConfig]:
    """Runs of the COMPANIONS (other data and model seeds) that fusion lets share a group with the method (prompt
    tuning's runs fuse only with prompt runs of their length: none of them)."""
    from .fusion import group_key

    key = group_key(_fused_run(subject.cfg, subject.bench, "fused"))
    runs = [subject.bench.run_config(name, seed=333 + 111 * (i % 2), model_seed=42 + i % 2)  # never the method's run
            for i, name in enumerate(COMPANIONS)]
    return [run for run in runs if key is not None and group_key(_fused_run(run, subject.bench, "fused")) == key]


def _fused_run(cfg: DictConfig, bench: Bench, folder: str) -> DictConfig:
    cfg = copy.deepcopy(cfg)
    cfg.fuse, cfg.results_dir = True, str(bench.results / folder)
    return cfg


def _device_run(cfg: DictConfig, bench: Bench, folder: str, **changes) -> DictConfig:
    cfg = copy.deepcopy(cfg)
    cfg.results_dir = str(bench.results / folder)
    cfg.precision = "auto"
    cfg.device = "auto"
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


@contextmanager
def on_a_gpu():
    """A GPU's path: on a CUDA machine the GPU itself (precision auto: bf16); elsewhere the CPU with bf16 autocast and
    a GPU's batch shapes (runner.group_settings' CUDA shapes: every member in one pass). Inside peltbench.devicecheck's
    net either way; yields (device type, the DeviceCheck)."""
    import torch

    from . import runner
    from .devicecheck import MODEL_DEVICE, DeviceCheck

    saved = runner.resolve_device, runner.group_settings
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # the runs on the device the net calls the model's (cpu:0; "cpu" is the host there)
        settings = runner.group_settings
        runner.resolve_device = lambda cfg, training=True: (MODEL_DEVICE, True)
        runner.group_settings = lambda *args, shapes_for=None, **kwargs: settings(*args, shapes_for="cuda", **kwargs)
    try:
        with DeviceCheck() as check:
            yield device, check
    finally:
        runner.resolve_device, runner.group_settings = saved


def _device_ok(outcome, check, where: str) -> None:
    if check.faults:
        raise CheckFailed(check.faults[0])
    if outcome.status != "ok":
        raise CheckFailed(f"{where}: {_error(outcome)}")
    record = outcome.record
    if record.get("precision") != "bf16" or not math.isfinite(record["test"]["main"]):
        raise CheckFailed(f"{where}: precision {record.get('precision')}, test {record['test']}")


def _same_as_pretrained(model, reference, inputs: dict, when: str) -> None:
    """Member 1 of `model` (no components, frozen head) computes `reference`'s logits."""
    import torch

    model.eval()
    with torch.no_grad():
        logits = model(*(_repeat(inputs[key], 2) for key in INPUTS))
        rows = inputs["input_ids"].shape[0]
        plain = {key: value for key, value in inputs.items() if value is not None}
        if not model.token_types:
            plain.pop("token_type_ids", None)
        expected = reference(**plain).logits
    member = logits[rows:]
    difference = float((member - expected).abs().max())
    scale = float(expected.abs().max())
    if not difference <= SCALE * max(scale, 1.0):
        raise CheckFailed(f"{when}, a member without components beside it no longer computes the pretrained model: "
                          f"its logits differ by {difference:.3g} (scale {scale:.3g}): a backbone tensor was changed")


def _repeat(tensor, times: int):
    return None if tensor is None else tensor.repeat(times, *[1] * (tensor.dim() - 1))


def _differing_from_pretrained(model, reference) -> list[str]:
    """The model's tensors that the pretrained model has under the same name and shape, not equal to its (a wrapper's
    `base.` / `inner.` left out of the name: PeltModel.stored_name); the new head layers are not the checkpoint's."""
    pretrained = reference.state_dict()
    head = {name for name in pretrained if name.split(".")[0] in _head_roots(model)}
    found = []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not name.startswith("backbone."):
            continue
        stored = model.stored_name(name)
        expected = pretrained.get(stored)
        if stored not in head and expected is not None and expected.shape == tensor.shape and \
                not _equal(tensor, expected):
            found.append(stored)
    return found


def _head_roots(model) -> set[str]:
    head = model.arch.head
    return {path.split(".")[0] for path in (head.out, head.dense) if path}


def _batch(bench: Bench, rows: int = 6):
    """The task's first `rows` rows, tokenised with the encoder's tokenizer: (inputs, labels)."""
    import torch

    from .model import load_tokenizer

    tokenizer = load_tokenizer(str(bench.checkpoint))
    lines = (bench.data / "SST-2" / "train.tsv").read_text().splitlines()[1 : rows + 1]
    sentences, labels = zip(*(line.split("\t") for line in lines))
    encoded = tokenizer(list(sentences), padding=True, return_tensors="pt")
    inputs = {key: encoded.get(key) for key in INPUTS}
    if inputs["token_type_ids"] is None:
        inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    return inputs, torch.tensor([int(label) for label in labels])


def _record_difference(alone: dict, fused: dict) -> str | None:
    """How a fused member's record differs from its run alone (docs/fused.md), or None."""
    for epoch, (a, b) in enumerate(zip(alone["history"], fused["history"]), start=1):
        if not _close(a["train_loss"], b["train_loss"], RELATIVE * abs(a["train_loss"]) + ABSOLUTE):
            return f"epoch {epoch} train loss {a['train_loss']:.7g} alone, {b['train_loss']:.7g} fused"
        if not _close(a["dev_main"], b["dev_main"], ABSOLUTE):
            return f"epoch {epoch} dev score {a['dev_main']} alone, {b['dev_main']} fused"
    if len(alone["history"]) != len(fused["history"]) or alone["best_epoch"] != fused["best_epoch"]:
        return (f"{len(alone['history'])} epochs (best {alone['best_epoch']}) alone, {len(fused['history'])} (best "
                f"{fused['best_epoch']}) fused")
    if not _scores_equal(alone["test"], fused["test"]):
        return f"test {alone['test']} alone, {fused['test']} fused"
    return None


def _close(a, b, tolerance: float) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= tolerance


def _scores_equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(_close(a[key], b[key], ABSOLUTE) for key in a)


def _equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a.detach().cpu(), b.detach().cpu()))


def _head_names(model) -> set[str]:
    from .methods import member_head

    return set(member_head(model, 0))


def _optimised_numel(optimizer, member: int) -> int:
    """The elements the optimiser updates for `member`: its trained segments' sizes."""
    return sum(int(length) for bank in optimizer.banks
               for length, owner, trained in zip(bank.lengths.tolist(), bank.segment_members, bank.trained)
               if owner == member and trained)


def bert_base_count(method: DictConfig) -> str:
    """What `peltbench-params` says of the method on bert-base-uncased's shape (a model built on the meta device)."""
    from transformers import BertConfig

    from .methods import count_method

    try:
        counts = count_method(method, BertConfig(num_labels=2))
    except Exception as error:  # noqa: BLE001 - the count check says why it cannot be counted
        return f"not counted on bert-base-uncased's shape ({type(error).__name__}: {_first_line(error)})"
    return f"{counts['trainable_params']:,} stored per task on bert-base-uncased's shape (peltbench-params)"


def _counted(counts: dict) -> str:
    return ", ".join(f"{key} {value:,}" if isinstance(value, int) else f"{key} {value}" for key, value in counts.items())


def _task(cfg: DictConfig):
    from .tasks import TaskSpec

    return TaskSpec.from_config(cfg.task)


def _cpu():
    import torch

    return torch.device("cpu")


def _members(cfgs: list[DictConfig], group: list[int]) -> str:
    """The runs beside the method's (the first): itself at other seeds, and the companions."""
    first = cfgs[group[0]]
    names = [f"{cfgs[i].method.name} (seed {cfgs[i].seed}, model seed {cfgs[i].model_seed})"
             if cfgs[i].method.name == first.method.name else cfgs[i].method.name for i in group[1:]]
    return f"{len(names)} runs: {', '.join(names)}"


def _losses(losses: list[float]) -> str:
    return " → ".join(f"{loss:.3f}" for loss in (losses[0], losses[-1]))


def _names(names: Sequence[str], shown: int = 3) -> str:
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _error(outcome) -> str:
    record = outcome.record or {}
    return str(record.get("error") or outcome.error or outcome.status)


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


# ---------------------------------------------------------------- running them


CHECK_FUNCTIONS: dict[str, Callable[[Subject], tuple[str, str | None]]] = {
    "trains": check_trains, "fused": check_fused, "slot": check_slot, "seed": check_seed, "backbone": check_backbone,
    "count": check_count, "device": check_device, "reload": check_reload,
}


def compose_method(request: Request, composer: Composer) -> DictConfig:
    """The request's method composed and checked as `peltbench` checks a run's config, before any model is built
    (UserError: one line)."""
    from .config import check_config

    cfg = composer(*method_overrides(request.method, request.settings))  # the composer adds the search path
    check_config(cfg)
    return cfg


def method_overrides(method: str, settings: Sequence[str] = ()) -> list[str]:
    """What the checks' runs compose: the method with its settings, the task, no logger."""
    return [f"method={method}", *settings, "task=sst2", "logger=[]"]


def check_fit(request: Request, bench: Bench) -> DictConfig:
    """The method's run on `bench`, refused in one line where the tiny encoder (hidden 32) cannot take it."""
    from .config import check_config, check_model_fit, local_model_config
    from .record import variant_name

    lr = [] if request.lr is None else [f"method.lr={request.lr}"]
    cfg = bench.run_config(request.method, [*request.settings, *lr])
    try:
        check_config(cfg)  # the method is valid (compose_method): what fails here is its fit to the tiny model
        check_model_fit(cfg, local_model_config(str(bench.checkpoint)))
    except UserError as error:
        raise UserError(f"method {cfg.method.name} does not fit the tiny {bench.encoder} encoder (hidden 32, 2 layers) "
                        f"the checks use: {error}; give method.KEY=VALUE settings that fit it") from None
    other = copy.deepcopy(cfg)
    other.model_seed = 43  # _other_seed's, which its folder's name says
    runs = [cfg, other, *(_trains_run(cfg, bench, float(cfg.method.lr) * f) for f in LR_FACTORS)]
    folder = max((variant_name(run) for run in runs), key=len)
    if len(folder.encode()) > NAME_MAX:
        raise UserError(f"method {cfg.method.name}: the checks' run folders would be named {folder[:60]}... "
                        f"({len(folder.encode())} bytes; a file system takes {NAME_MAX}): a method not packaged with "
                        f"peltbench lists every setting in its folder's name; give it a shorter name")
    return cfg


def run_checks(request: Request, root: Path, checks: Sequence[str] = CHECKS,
               say: Callable[[str], None] | None = None) -> list[Verdict]:
    """Every check of `checks` on each of the request's encoders (`request.encoders`), under `root`; one Verdict per
    check. UserError (one line) where the method cannot be checked at all."""
    composer = Composer(request.search)
    compose_method(request, composer)
    benches = [make_bench(encoder, root, composer) for encoder in request.encoders]
    subjects = [Subject(request, bench, check_fit(request, bench)) for bench in benches]
    verdicts = {check: Verdict(check) for check in checks}
    cpu = time.process_time()
    for subject in subjects:
        for check in checks:
            verdict = verdicts[check]
            try:
                note = CHECK_FUNCTIONS[check](subject)
            except Skip as skip:
                if str(skip) not in verdict.skipped:
                    verdict.skipped.append(str(skip))
                verdict.skipped_on.append(subject.bench.encoder)
            except CheckFailed as failure:
                verdict.failures.append(f"{subject.bench.encoder}: {failure}")
            except UserError as error:
                verdict.failures.append(f"{subject.bench.encoder}: {error}")
            except Exception as error:  # noqa: BLE001 - the component's own code raised: this check fails with it
                verdict.failures.append(f"{subject.bench.encoder}: {type(error).__name__}: {_first_line(error)}")
            else:
                verdict.passed.append((subject.bench.encoder, *note))
            if say is not None:
                say(f"{subject.bench.encoder} {check}: {time.process_time() - cpu:.2f} CPU s")
            cpu = time.process_time()
    return [verdicts[check] for check in checks]


def main(argv: Sequence[str] | None = None) -> None:
    import logging

    os.environ.setdefault("TQDM_DISABLE", "1")
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        request = parse(argv)
    except UserError as error:
        _refuse(error)
    quiet = logging.getLogger("peltbench")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the runs' own lines: the verdicts say what matters
    try:
        _check(request)
    finally:  # called in a process that goes on (a test, a notebook): its peltbench lines come back
        quiet.setLevel(level)


def _check(request: Request) -> None:
    started, cpu = time.time(), time.process_time()
    root = Path(request.keep).expanduser() if request.keep else Path(tempfile.mkdtemp(prefix="peltbench-check-"))
    try:
        verdicts = run_checks(request, root)
    except UserError as error:
        _refuse(error)
    finally:
        if not request.keep:
            shutil.rmtree(root, ignore_errors=True)
    counted = next(verdict for verdict in verdicts if verdict.check == "count")
    if counted.status == "PASS":
        counted.note = bert_base_count(compose_method(request, Composer(request.search)).method)
    families = len(request.encoders)
    print(f"peltbench-check-method {request.method}: {families} tiny encoder{'s' if families > 1 else ''} "
          f"({', '.join(request.encoders)})")
    for verdict in verdicts:
        print(verdict.line())
    failed = sum(verdict.status == "FAIL" for verdict in verdicts)
    print(f"{len(verdicts)} checks: {sum(v.status == 'PASS' for v in verdicts)} passed, {failed} failed, "
          f"{sum(v.status == 'SKIP' for v in verdicts)} skipped ({time.time() - started:.0f} s, "
          f"{time.process_time() - cpu:.0f} CPU s)")
    sys.exit(1 if failed else 0)


def _refuse(error: UserError) -> None:
    """A METHOD or setting that cannot be checked: one line, exit status 2."""
    print(f"peltbench-check-method: error: {error}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
