"""Experiments, end to end: config → data split → model + methods → training → result records.

`run_group` trains a group of compatible runs together on one frozen backbone (peltbench.fusion decides
which runs are compatible); `run_experiment` is a group of one. Each run keeps its own record.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import traceback
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from . import UserError
from . import checkpoint as checkpoints
from . import demonstrations
from .cloze import is_cloze, prompt_label_ids, prompt_of
from .config import CPU_BF16, ModelMisfit, check_config, check_model_fit, few_shot_warning
from .data import dev_halves, encode, few_shot_split, lmbff_chain, lmbff_split, load_split
from .methods import (added_tokens, build_pelt_model, count_method, label_words, layout_key, load_member_head,
                      load_member_state, member_frozen, member_head, member_state)
from .metrics import majority_score
from .loggers import RunLogger, check_can_start, open_logger
from .methods.base import Cloze
from .model import initial_head, load_backbone, load_config, load_masked_lm, load_tokenizer
from .saving import (WEIGHTS, check_owner, check_shapes, member_weights, read_weights, save_predictions,
                     save_weights)
from .claim import Claim, claim_run, describe, drop_dead_claim, live_claim, remove_empty_run_folder
from .record import (SCHEMA, DamagedRecord, RecordWriteError, changed_meaning, check_existing, config_hash, container,
                     data_location, machine,
                     model_identity, peak_memory, probe_writable, record_path, reset_peak_memory, semantic_config, unsaved,
                     utc_now, variant_name, versions, write_record)
from .allocator import kept_memory
from .interrupts import interrupted
from .halving import Halving, ledger_path, pruned_record
from .objectives import classifier_pooling, resolved as resolved_objective
from .protocols import protocol_name
from .tasks import TaskSpec
from .train import (EvaluationSet, GroupSettings, Member, MemberResult, ResumeError, TrainSettings, evaluate, fit,
                    predicted)

log = logging.getLogger("peltbench")
DROPOUT = "per-run"  # how dropout masks are drawn (methods/randomness.py; docs/record.md `dropout`)


@dataclass
class Outcome:
    """What became of one run: `ok` (trained now or done before), `pruned` (stopped by successive halving, now or
    before: peltbench.halving), `failed` (a failed record was written) or `error` (a bad config or input: no record).
    `error` holds the exception for the last two."""

    status: str
    record: dict | None = None
    error: BaseException | None = None
    skipped: bool = False


def sweep_status(outcome: Outcome) -> str:
    """What a sweep's job returns for a run: its status, or `skipped` for a run done before (the launchers' progress
    and ETA count it as free; the summary reads the records). A bad input or a failure is logged in one line, in the
    run's own job log (the summary reads it from there when there is no record)."""
    if outcome.status in ("error", "failed") and outcome.error is not None:
        log.error("%s", outcome.error)
    if isinstance(outcome.error, DamagedRecord):  # its folder holds a damaged record (record.damage): so named
        return "damaged"
    return "skipped" if outcome.skipped else outcome.status  # pruned: done for a halving sweep


def run_experiment(cfg: DictConfig, results_dir: Path | None = None) -> dict:
    """Run one config and write its record, or return the finished record of an identical earlier run.

    A UserError (bad config or input) writes no record. Any other failure, and a run its model cannot take
    (config.ModelMisfit, found once it started), writes a `failed` record, which a later identical run retries, and
    is raised again. A run that another live process is training
    (peltbench.claim) is not run: the result is {"status": "running"}.
    """
    [outcome] = run_group([cfg], results_dir)
    if outcome.error is not None:
        raise outcome.error
    return outcome.record


def run_group(cfgs: list[DictConfig], results_dir: Path | None = None) -> list[Outcome]:
    """Train the runs of `cfgs` together on one backbone (a group of one: a separate run); one Outcome each.

    Records go under `results_dir`, or each config's own `results_dir` (relative to the working directory).

    Runs already done are skipped; a run another live process is training (its claim, peltbench.claim) is left
    to it (status `running`); a run with a bad config or input is left out (status `error`); a crash while
    training writes `failed` records for the runs that had not finished yet. Each run is claimed while it trains:
    a member of a group releases its claim as soon as its record is written, not when the whole group ends.
    """
    outcomes: list[Outcome | None] = [None] * len(cfgs)
    runs: list[_Run] = []
    with ExitStack() as claims:
        for index, cfg in enumerate(cfgs):
            try:
                run = _Run.prepare(cfg, results_dir or Path(str(cfg.results_dir)).expanduser().absolute())
                outcome = run.claim(claims)
            except UserError as error:
                outcome = Outcome("error", error=error)
            if outcome is not None:
                outcomes[index] = outcome
            else:
                run.index = index
                runs.append(run)
        if runs:
            try:
                trained = _train(runs)
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the runs it stopped leave their folders as they found them
                for run in runs:
                    if run.held is not None:
                        _abandon(run)
                raise
            for run, outcome in zip(runs, trained):
                outcomes[run.index] = outcome
    return outcomes  # type: ignore[return-value]


@dataclass
class _Run:
    """One run being prepared and trained: its config, where its record goes, its data."""

    cfg: DictConfig
    path: Path
    digest: str
    finished: dict | None
    index: int = 0
    member: Member | None = None
    record: dict | None = None
    logger: RunLogger | None = None
    held: Claim | None = None  # this process's claim on the run, while it trains
    replay: bool = False  # a member of a resumed group that trains along only (its record exists, or not this job's)
    resumed: dict | None = None  # what its group's checkpoint kept for it (runs_state: its loggers, when it started)
    checkpoint: checkpoints.Checkpointer | None = None  # its group's, while it trains

    @classmethod
    def prepare(cls, cfg: DictConfig, results_dir: Path) -> _Run:
        check_config(cfg)
        cfg = decided(cfg)
        path = record_path(cfg, results_dir)
        digest = config_hash(cfg)
        run = cls(cfg, path, digest, None, record=_identity(cfg, digest))
        run.finished = run.done()
        if run.finished is None:
            check_can_start(cfg.get("logger"))  # W&B without a key, an MLflow server that is down: before the model
        return run

    def done(self, say: bool = True) -> dict | None:
        """The run's finished record, unless it lacks a file this run asks for (then it trains again, and with
        `say` the log says why: once per run, not again when the claim is checked)."""
        finished = check_existing(self.path, self.cfg)
        if finished is None:  # a halving sweep's pruned run is done for it (halving off trains it fully)
            finished = pruned_record(self.path, self.cfg)
        missing = unsaved(self.cfg, self.path.parent)
        if finished is not None and missing and finished.get("status") == "ok":
            if say:
                log.info("rerun: %s is done but has no %s, which this run asks for", self.path.parent,
                         " or ".join(missing))
            return None
        return finished

    def claim(self, claims: ExitStack) -> Outcome | None:
        """Claim the run for this process (held until `claims` closes), or the Outcome that says why not."""
        if self.finished is None:
            probe_writable(self.path)  # an unwritable results_dir or a full disk is found now, not after training
            claim = claim_run(self.path)
            if claim is None:  # another process is training it; its record will appear
                holder = describe(live_claim(self.path) or {})
                log.info("skip: %s is being run by another process (%s)", self.path.parent, holder)
                return Outcome("running", error=RuntimeError(f"being run by another process ({holder})"))
            self.held = claims.enter_context(claim)
            checkpoints.clean(self.path.parent)  # a checkpoint write that was killed
            self.finished = self.done(say=False)  # written by whoever held the claim until now?
        if self.finished is None:
            log.info("run: %s", self.path.parent)
            warning = few_shot_warning(self.cfg)
            if warning:
                log.warning("%s", warning)
            return None
        _release(self)  # finished by whoever held the claim until now
        drop_dead_claim(self.path)
        checkpoints.remove(self.path.parent)  # a done run's: left by a process killed as it wrote the record
        if self.finished.get("status") == "pruned":
            log.info("skip: %s was pruned at rung %s (halving; halving=null trains it fully)", self.path.parent,
                     (self.finished.get("pruned") or {}).get("rung"))
            return Outcome("pruned", self.finished, skipped=True)
        log.info("skip: %s is already done (test %s %s)", self.path.parent, self.cfg.task.main_metric,
                 self.finished["test"]["main"])
        return Outcome("ok", self.finished, skipped=True)

    @property
    def label(self) -> str:
        return f"{variant_name(self.cfg)}/{self.cfg.task.name}/k{self.cfg.k}/seed{self.cfg.seed}"


def _train(runs: list[_Run]) -> list[Outcome]:
    """Load the data of every run, build the group's model, train it; write each run's record as it finishes.

    A bad input (UserError) leaves its run out with no record; a run that does not fit its model (ModelMisfit) and
    any other failure write `failed` records for the runs not finished yet.
    """
    first = runs[0].cfg
    use_allocated_cpus()
    outcomes: dict[int, Outcome] = {}
    try:
        task = TaskSpec.from_config(first.task)
        device, bf16 = resolve_device(first)
        for run in runs:  # known from here on: a run that fails later is still a run of its protocol (the tables)
            run.record.update(device=str(device), precision="bf16" if bf16 else "fp32")
        tokenizer = load_tokenizer(first.model.name)
        model_config = load_config(first.model.name, task.num_labels).to_dict()  # a Hub model's, before any weights
        ready = []
        for run in runs:
            try:
                check_model_fit(run.cfg, model_config)  # each run's own: a misfit leaves only that run out
                run.member, data = prepare_member(run.cfg, task, tokenizer, run.label)
                longest = max((len(ids) for rows in (run.member.train, run.member.dev, run.member.test)
                               for ids in rows.input_ids), default=0)
                check_model_fit(run.cfg, model_config, longest)  # its rows (+ prompts) within the position table
                run.record.update(data)
                ready.append(run)
            except ModelMisfit as error:  # the run does not fit its model, found once it started: its record says so
                outcomes[id(run)] = _failed(run, error, None)
            except UserError as error:  # bad input (a data file, k beyond the rows): no record, as before a run
                outcomes[id(run)] = Outcome("error", error=error)
                _abandon(run)
        resumed = _resumed_groups(ready, task, tokenizer, model_config)
        for group_runs, resume in resumed:
            _train_group(group_runs, task, device, bf16, tokenizer.pad_token_id, outcomes, resume)
        going_on = {id(run) for group_runs, _ in resumed for run in group_runs}
        ready = [run for run in ready if id(run) not in going_on]
        longest = max((len(ids) for run in ready for ids in run.member.train.input_ids), default=0)
        cap = memory_cap([run.cfg for run in ready], task, device, bf16, longest) if ready else 1
        for start in range(0, len(ready), cap):
            _train_group(ready[start : start + cap], task, device, bf16, tokenizer.pad_token_id, outcomes)
    except UserError as error:
        for run in runs:
            if id(run) not in outcomes:
                outcomes[id(run)] = Outcome("error", error=error)
                _abandon(run)
    except Exception as error:  # a crash: every run not finished gets a `failed` record, which a rerun retries
        if interrupted():  # Ctrl-C, which the code it hit turned into another exception: no run failed
            raise KeyboardInterrupt from error
        trace = traceback.format_exc()
        for run in runs:
            if id(run) not in outcomes:
                outcomes[id(run)] = _failed(run, error, trace)
    return [outcomes[id(run)] for run in runs]


def _resumed_groups(ready: list[_Run], task: TaskSpec, tokenizer, model_config) -> list[tuple[list[_Run], object]]:
    """The groups that go on from a checkpoint (peltbench.checkpoint.resumable), each as it was: its members in its
    order, the ones not among `ready` (done since, or not this job's) as runs that train along only (`replay`)."""
    groups = []
    for resumed in checkpoints.resumable([(run.path.parent, run.digest, run.label) for run in ready]):
        mine = [ready[index] for index in resumed.runs.values()]
        try:
            runs = []
            for position, member in enumerate(resumed.members):
                run = ready[resumed.runs[position]] if position in resumed.runs else \
                    _replay(member, mine[0].path.parents[4], task, tokenizer, model_config)
                run.resumed = resumed.payload["runs"][position]
                runs.append(run)
        except (UserError, KeyError, ValueError, TypeError) as error:  # a member's data or config is not there now
            log.warning("cannot rebuild the group of checkpoint %s (%s): its runs start over", resumed.where, error)
            for run in mine:
                checkpoints.remove(run.path.parent)
            continue
        along = sum(run.replay and not resumed.stopped(position) for position, run in enumerate(runs))
        stopped = sum(run.replay and resumed.stopped(position) for position, run in enumerate(runs))
        what = mine[0].label if len(runs) == 1 else f"a fused group of {len(runs)} runs ({len(mine)} of this job's)"
        log.info("resume: %s from its checkpoint at %s%s%s", what, resumed.line(),
                 f"; {along} of them (done since, or not this job's) train along again, writing nothing" if along else "",
                 f"; {stopped} had stopped training before it and stay stopped" if stopped else "")
        groups.append((runs, resumed))
    return groups


def _replay(member: dict, results_dir: Path, task: TaskSpec, tokenizer, model_config) -> _Run:
    """A member of a resumed group that this job does not record: it trains along so that the group computes what it
    did (its record exists by now, or another job has it)."""
    cfg = OmegaConf.create(member["config"])
    run = _Run(cfg, record_path(cfg, results_dir), member["config_hash"], None, replay=True,
               record=_identity(cfg, member["config_hash"]))
    check_model_fit(cfg, model_config)
    run.member, _ = prepare_member(cfg, task, tokenizer, run.label)
    run.member.wanted = False
    return run


def prepare_member(cfg: DictConfig, task: TaskSpec, tokenizer, name: str) -> tuple[Member, dict]:
    """A run's seeded split, tokenised, and its settings, as a member of a group; and what its record says of
    its data."""
    data_dir = None if cfg.data.dir is None else str(cfg.data.dir)
    train_split = load_split(task, data_dir, "train")
    test_split = load_split(task, data_dir, "test")
    train_rows, dev_rows, test_rows, dev_split = split_rows(cfg, task, train_split, test_split)
    length = cfg.train.max_length
    prompt = None
    if is_cloze(cfg):  # each row built by the run's template; its label words one token each, or refused here
        prompt = prompt_of(cfg, task)
        prompt_label_ids(prompt, task, tokenizer)
    if demonstrations.wanted(cfg):  # each input with one training row of each class (LM-BFF's prompt-demo)
        sets = demonstrations.run_sets(cfg, task, tokenizer, [(train_split, train_rows), (dev_split, dev_rows),
                                                              (test_split, test_rows)])
    else:
        sets = [encode(split, rows, tokenizer, length, prompt)
                for split, rows in ((train_split, train_rows), (dev_split, dev_rows), (test_split, test_rows))]
    member = Member(
        name=name,
        train=sets[0],
        dev=sets[1],
        test=sets[2],
        settings=TrainSettings(lr=cfg.method.lr, epochs=cfg.train.epochs, patience=cfg.train.patience,
                               grad_clip=cfg.train.grad_clip, seed=cfg.model_seed, data_seed=cfg.seed,
                               steps=cfg.train.get("max_steps"), eval_every=cfg.train.get("eval_every")),
        test_rows=None if len(test_rows) == len(test_split) else test_rows,
    )
    data = {
        "test_examples": len(test_rows), "data_source": train_split.source,
        "split": {"train_indices": None if cfg.k == "all" else train_rows.tolist(),
                  "dev_indices": None if dev_split is test_split else dev_rows.tolist()},
    }
    if member.test_rows is not None:  # GLUE dev in two parts (full_halves): its rows that select, and those reported
        data["split"].update(glue_dev_selection=dev_rows.tolist(), glue_dev_test=test_rows.tolist())
    return member, data


def split_rows(cfg: DictConfig, task: TaskSpec, train_split, test_split) -> tuple:
    """(train rows, dev rows, test rows, the split the dev rows index) under the run's protocol (`protocol.dev`)."""
    dev = cfg.protocol.dev if cfg.get("protocol") is not None else "train"
    everything = np.arange(len(test_split))
    if dev == "per_class":  # LM-BFF: K train and K dev rows per class
        chain = lmbff_chain(cfg.seed, task.lmbff_chained)
        train_rows, dev_rows = lmbff_split(train_split.labels, cfg.k, cfg.seed, task.lmbff_threshold, chain)
        return train_rows, dev_rows, everything, train_split
    if cfg.k != "all":  # UniPELT §4.1: K rows, then dev_size rows, of one seeded permutation
        train_rows, dev_rows = few_shot_split(len(train_split), cfg.k, cfg.seed, cfg.dev_size)
        return train_rows, dev_rows, everything, train_split
    train_rows = np.arange(len(train_split))
    if dev == "glue_dev_halves":  # ReFT: one part of GLUE dev selects, the other is reported
        dev_rows, test_rows = dev_halves(len(test_split), cfg.seed, f"{task.name}'s test set ({test_split.source})")
        return train_rows, dev_rows, test_rows, test_split
    return train_rows, everything, everything, test_split  # Table 3, full_median, full_mean: GLUE dev for both


def memory_cap(cfgs: list[DictConfig], task: TaskSpec, device: torch.device, bf16: bool,
               longest: int | None = None) -> int:
    """How many of these runs one group may hold: no more than fit in the device's free memory (the GPU's, or on
    a CPU the memory the system has available, within the cgroup's limit under SLURM or a container).

    Per member, an estimate of training's peak: the activations kept for the backward pass of a batch (34·s·b·h
    bytes per layer in 16-bit, plus 5·heads·s²·b for attention: Korthikanti et al. 2022, doubled in fp32) and 16
    bytes per trained parameter (fp32 weight, gradient, two AdamW moments). On CUDA s is the max length; a CPU pads
    each batch to its longest row, so there s is the longest training row of these runs (`longest`), when known.
    The group gets 80% of what is free once the backbone is loaded; when that is fewer runs than asked, the group
    trains in parts, one after the other, and the log says so.
    """
    first = cfgs[0]
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        rows = first.train.max_length
    else:
        free = available_memory()
        rows = min(longest or first.train.max_length, first.train.max_length)
        if free is None or len(cfgs) == 1:
            return len(cfgs)
    config = load_config(first.model.name, task.num_labels)
    width = 2 if bf16 else 4
    length = rows + added_tokens(first.method)
    tokens = first.train.batch_size * length  # a group's runs share one prompt length (peltbench.fusion)
    activations = config.num_hidden_layers * tokens * (
        34 * config.hidden_size * width / 2 + 5 * config.num_attention_heads * length * width / 2)
    counts = []
    for cfg in cfgs:
        try:
            counts.append(count_method(cfg.method, config))
        except Exception:  # noqa: BLE001 - a run that cannot be counted fails alone when its group is built
            continue
    if not counts:
        return len(cfgs)
    trained = max(count["optimizer_params"] for count in counts)
    backbone = 4 * counts[0]["backbone_params"]  # fp32 weights (the embeddings' share is small)
    cap = min(len(cfgs), max(1, int(0.8 * (free - backbone) // (activations + 16 * trained))))
    if cap < len(cfgs):
        log.info("%d of these %d runs fit in the %.1f GiB free on %s at once: the group trains in parts of %d",
                 cap, len(cfgs), free / 2**30, device.type, cap)
    return cap


def available_memory() -> int | None:
    """Bytes a CPU run may still use: Linux's MemAvailable, within the cgroup's limit (cgroup v2 memory.max minus
    memory.current) where one is set; None where neither can be read."""
    limits = []
    try:
        with open("/proc/meminfo") as meminfo:
            limits += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")]
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            limits.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


def decided(cfg: DictConfig) -> DictConfig:
    """The run's config with what its checkpoint decides decided (`objective.pooling: auto`: peltbench.objectives),
    asking the Hub where the cache cannot tell: what its record's config holds, so that the record says what the run
    computed and its identity is read from its config alone. The config itself where nothing is left to decide (a
    cloze run's prompt is not decided here: a null setting stays the task file's, objectives.identity reads it
    there)."""
    node = resolved_objective(cfg, strict=True)
    if node is None or node == OmegaConf.to_container(cfg.objective, resolve=True):
        return cfg
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.objective = node
    return cfg


def group_model(cfgs: list[DictConfig], task: TaskSpec, device: torch.device):
    """The runs' methods on one copy of the pretrained backbone, each run with the head its model seed draws reading
    what its objective's pooling says, its value decided (a config not run by the runner, e.g. a check's, decides it
    here); or, with objective=cloze (a fused group holds one objective), the masked-LM head's rows of its label
    words."""
    first = cfgs[0]
    if is_cloze(first):
        tokenizer = load_tokenizer(first.model.name)
        words = tuple(prompt_label_ids(prompt_of(cfg, task), task, tokenizer) for cfg in cfgs)
        cloze = Cloze(words, tokenizer.mask_token_id, task.is_regression)
        return build_pelt_model(load_masked_lm(first.model.name), [cfg.method for cfg in cfgs],
                                [cfg.model_seed for cfg in cfgs], cloze=cloze).to(device)
    backbone = load_backbone(first.model.name, task.num_labels, first.model_seed)
    heads = [initial_head(cfg.model.name, task.num_labels, cfg.model_seed) for cfg in cfgs]
    poolings = [classifier_pooling(resolved_objective(cfg, strict=True)) for cfg in cfgs]
    return build_pelt_model(backbone, [cfg.method for cfg in cfgs], [cfg.model_seed for cfg in cfgs], heads,
                            poolings).to(device)


CPU_ROWS_PER_PASS = 64  # a CPU's training pass: the members whose rows make about this many (docs/fused.md, measured)


def group_settings(cfg: DictConfig, model, pad_id: int, device: torch.device, bf16: bool,
                   shapes_for: str | None = None) -> GroupSettings:
    """What the group's runs share (from its first run's config: compatible runs agree on it).

    The batch shapes suit the device (`shapes_for`: another device type's, for the benchmark's operator count).
    A GPU waits on launches, so each pass is as big as it gets: every member evaluates `eval_batch_size` rows
    at a time. A CPU waits on arithmetic and is fastest per row around `eval_batch_size` rows per pass (bigger
    tensors leave its caches), so there the members share those rows out, a training step's forward and backward
    run a few members at a time (about CPU_ROWS_PER_PASS rows: train.member_passes), and each pass in
    length-sorted parts (train.pieces; an evaluation batch where that pads less: train.length_cuts). None of it
    changes a result beyond float rounding.
    """
    cpu = (shapes_for or device.type) == "cpu"
    eval_batch_size = cfg.train.eval_batch_size
    if cpu:
        eval_batch_size = -(-eval_batch_size // model.members.count)
    return GroupSettings(
        batch_size=cfg.train.batch_size, eval_batch_size=eval_batch_size, pad_id=pad_id,
        pad_to=cfg.train.max_length if model.members.padded_pooling else None,
        device=device, bf16=bf16, split_by_length=cpu,
        members_per_pass=max(1, CPU_ROWS_PER_PASS // cfg.train.batch_size) if cpu else None,
    )


def _train_group(runs: list[_Run], task: TaskSpec, device: torch.device, bf16: bool, pad_id: int,
                 outcomes: dict[int, Outcome], resume: checkpoints.Resumed | None = None) -> None:
    """Train a group (its runs, or with `resume` a group as its checkpoint has it, members that train along included)
    and write each run's record as it finishes."""
    if resume is None:
        runs = sorted(runs, key=lambda run: layout_key(run.cfg.method))
    first = runs[0].cfg
    fused = _fused(runs)
    measures = reset_peak_memory(device)  # each group's own peak (record `peak_memory`)
    try:
        model = group_model([run.cfg for run in runs], task, device)
    except Exception as error:  # a member the group cannot be built with fails alone; the others train without it
        if resume is not None and not interrupted():  # the group it was cannot be built now: start over without it
            _start_over(runs, resume, error, task, device, bf16, pad_id, outcomes)
            return
        if len(runs) == 1 or interrupted():
            raise
        faults = {id(run): fault for run in runs if (fault := _fails_alone(run, task, device)) is not None}
        if not faults:  # no member fails alone: the group itself cannot be built (every member's record says so)
            raise error
        for run in runs:
            if id(run) in faults:
                outcomes[id(run)] = _failed(run, faults[id(run)], "".join(traceback.format_exception(faults[id(run)])))
        rest = [run for run in runs if id(run) not in faults]
        if rest:
            _train_group(rest, task, device, bf16, pad_id, outcomes)
        return
    for run in runs:
        run.record.update(count_method(run.cfg.method, model.config, label_words(model)))
        run.record.update(architecture=model.config.model_type, device=str(device), machine=machine(device),
                          precision="bf16" if bf16 else "fp32", fused=fused, dropout=DROPOUT)
    if fused:
        log.info("fused group %s: %d runs on one %s backbone (%s), %s, %s", fused["group"], len(runs),
                 first.model.name, model.arch.name, device, "bf16" if bf16 else "fp32")
        for run in runs:
            log.info("  %s", run.label)
    else:
        record = runs[0].record
        log.info("%s on %s, %s (%s), protocol %s: %s trainable parameters stored per task (%s in the optimiser), %s, %s",
                 first.method.name, task.name, first.model.name, model.arch.name, record["protocol"],
                 f"{record['trainable_params']:,}",
                 f"{record['optimizer_params']:,}", device, record["precision"])
    group = group_settings(first, model, pad_id, device, bf16)
    for run in runs:
        if run.resumed is not None:
            run.record["started_at"] = run.resumed["started_at"]
        run.logger = RunLogger({}, run.label) if run.replay else \
            open_logger(run.cfg, run.path.parent, run.label, resume=(run.resumed or {}).get("logger"))
    checkpoint = checkpoints.Checkpointer(
        [{"label": run.label, "config_hash": run.digest, "config": run.record["config"]} for run in runs],
        [None if run.replay else run.path.parent for run in runs], first.train.get("checkpoint_every"),
        lambda: [{"started_at": run.record["started_at"], "logger": run.logger.state()} for run in runs], resume)
    for run in runs:
        run.checkpoint = checkpoint

    def on_epoch(index: int, evaluation: int, metrics: dict) -> None:  # logged at its step when dev is every N steps
        every = runs[index].cfg.train.get("eval_every")
        runs[index].logger.log_epoch(evaluation * every if every else evaluation, metrics)

    def ledger_entry(run: _Run):  # the run's ledger and length in evaluations, for successive halving
        spe = -(-len(run.member.train) // group.batch_size)
        settings = run.member.settings
        return run.cfg, ledger_path(run.path.parents[4], run.cfg), -(-settings.total_steps(spe) // settings.period(spe))

    def on_done(index: int, result: MemberResult) -> None:
        if runs[index].replay:  # its record exists, or is another job's
            return
        runs[index].record["peak_memory"] = peak_memory(device, len(runs), measures)
        outcomes[id(runs[index])] = _finish(runs[index], result, model, index, task)

    try:
        with kept_memory(device):  # a CPU keeps freed memory for the next step (peltbench.allocator)
            fit(model, [run.member for run in runs], task, group, on_done, on_epoch,
                halving=Halving([ledger_entry(run) for run in runs]), checkpoint=checkpoint)
    except ResumeError as error:  # before any step: no record is written yet
        for run in runs:
            run.logger.close(failed=True)
        del model
        _start_over(runs, resume, error, task, device, bf16, pad_id, outcomes)
        return
    finally:
        for run in runs:
            run.logger.close(failed=id(run) not in outcomes or outcomes[id(run)].status not in ("ok", "pruned"))


def _start_over(runs: list[_Run], resume: checkpoints.Resumed, error: BaseException, task: TaskSpec,
                device: torch.device, bf16: bool, pad_id: int, outcomes: dict[int, Outcome]) -> None:
    """A checkpoint's group that cannot be built or put back now: one line, and this job's runs start over."""
    log.warning("%s cannot resume its group (%s): its runs start over", resume.where,
                (str(error).strip().splitlines() or [type(error).__name__])[0])
    mine = [run for run in runs if not run.replay]
    for run in mine:
        checkpoints.remove(run.path.parent)
        run.resumed = run.checkpoint = None
        run.member.reset()
    _train_group(mine, task, device, bf16, pad_id, outcomes)


def _finish(run: _Run, result: MemberResult, model, slot: int, task: TaskSpec) -> Outcome:
    """A run leaves the group: keep what it asked for (weights, predictions), tell its logger, write its record."""
    if result.pruned is not None:
        return _record(run, result, task)
    if result.error is None:
        try:
            saved = []
            if run.cfg.save.weights:
                weights = member_weights(model, slot, run.cfg.method, model.config)
                saved += save_weights(run.path.parent, weights, run.cfg, model.arch,
                                      member_frozen(model, slot, run.cfg.method), model.config)
            if run.cfg.save.predictions:
                saved.append(save_predictions(run.path.parent, result.predictions, run.member.test.row_labels, task,
                                              result.logits, run.member.test_rows))
            run.record["saved"] = saved
        except OSError as error:
            result.error = f"could not save the run's {'weights' if run.cfg.save.weights else 'predictions'}: {error}"
        else:
            run.logger.log_test({**{f"test_{key}": value for key, value in result.test.items() if key != "main"},
                                 **{f"dev_best_{key}": value for key, value in result.dev_best.items() if key != "main"},
                                 **({"best_step": result.best_step} if result.best_step is not None else
                                    {"best_epoch": result.best_epoch})},
                                epoch=result.best_step if result.best_step is not None else result.best_epoch)
    return _record(run, result, task)


def _record(run: _Run, result: MemberResult, task: TaskSpec) -> Outcome:
    """Write a run's record as it leaves the group."""
    record = run.record
    if result.error is not None:
        return _failed(run, RuntimeError(result.error), None, result)
    record.update(
        test=result.test, dev_best=result.dev_best, best_epoch=result.best_epoch, epochs_run=result.epochs_run,
        history=result.history, train_seconds=round(result.train_seconds, 3), train_steps=result.train_steps,
        eval_seconds=round(result.eval_seconds, 3), test_seconds=round(result.test_seconds, 3), gates=result.gates,
        train_seconds_share=round(result.train_seconds_share, 3), eval_seconds_share=round(result.eval_seconds_share, 3),
        status="ok",
    )
    if result.best_step is not None:  # dev every train.eval_every steps (LM-BFF): the step restored, not an epoch
        record["best_step"] = result.best_step
    if result.pruned is not None:  # successive halving stopped it at a rung: its dev so far, no test score
        record.update(status="pruned", pruned=result.pruned, gates=None)
    try:
        write_record(run.path, {**record, "finished_at": utc_now()})
        _recorded(run)
    except RecordWriteError as error:  # logged; the others go on, and the sweep summary reports this run
        return Outcome("failed", record, error)
    finally:
        _release(run)
    if result.pruned is not None:
        log.info("pruned: %s at rung %d (dev %s %s, rank %d of %d; halving keeps %d), record %s", run.label,
                 result.pruned["rung"], task.main_metric, result.pruned["dev"], result.pruned["rank"],
                 result.pruned["of"], result.pruned["kept"], run.path)
        return Outcome("pruned", record)
    scores = ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a" for k, v in result.test.items() if k != "main")
    best = (f"best dev epoch {result.best_epoch} of {result.epochs_run}" if result.best_step is None
            else f"best dev step {result.best_step} of {result.train_steps}")
    # What always answering the most frequent test label scores, beside the score: a run that learnt nothing shows.
    # Named a baseline, so that it cannot read as what this run did (issue 32, 6)
    majority = majority_score(task.main_metric, run.member.test.row_labels)
    baseline = f" (majority-class baseline: {task.main_metric} {majority:.2f})" if majority is not None else ""
    # (the label names the protocol where it is not unipelt: its folder's `,protocol=lmbff`)
    log.info("done: %s: test %s%s, %s, record %s", run.label, scores, baseline, best, run.path)
    return Outcome("ok", record)


def _fails_alone(run: _Run, task: TaskSpec, device: torch.device) -> BaseException | None:
    """The error building this run's model alone raises (its own reason), or None when it builds."""
    try:
        group_model([run.cfg], task, device)
    except Exception as error:  # noqa: BLE001 - any error is this member's own
        return error
    return None


def _failed(run: _Run, error: BaseException, trace: str | None, result: MemberResult | None = None) -> Outcome:
    record = run.record
    if result is not None:
        message = str(error)
    else:  # a UserError's message is its own line (config.ModelMisfit); anything else is named by its type
        message = (str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}").splitlines()[0]
    record.update(status="failed", error=message, traceback=trace, test=None, dev_best=None)
    if result is not None:
        record.update(history=result.history, epochs_run=result.epochs_run, train_steps=result.train_steps)
    try:
        write_record(run.path, {**record, "finished_at": utc_now()})
        _recorded(run)
    except RecordWriteError:  # logged, with the run's own error
        return Outcome("failed", record, error)
    finally:
        _release(run)
    log.error("failed: %s: %s (record written to %s)", run.label, record["error"], run.path)
    return Outcome("failed", record, error)


def _recorded(run: _Run) -> None:
    """The run's record is written: its checkpoint goes (its group's other runs keep theirs)."""
    checkpoints.mark_progress()
    if run.checkpoint is not None:
        run.checkpoint.leave(run.path.parent)
    else:
        checkpoints.remove(run.path.parent)


def _release(run: _Run) -> None:
    """The run has left its group (its record written, or not writable): its claim goes now, so that a group killed
    later leaves no claim on a finished member (docs/record.md: a claim exists only while its run trains)."""
    if run.held is not None:
        run.held.release()
        run.held = None


def _abandon(run: _Run) -> None:
    """A run that leaves without a record (stopped by Ctrl-C or SIGTERM; bad input found once it had started): its
    claim released, what its loggers wrote removed (kept where a checkpoint goes on from it), and its folder, if that
    leaves only its lock, removed."""
    _release(run)
    if run.logger is not None:
        if checkpoints.exists(run.path.parent):
            run.logger.close(failed=True)
        else:
            run.logger.discard()
    remove_empty_run_folder(run.path)


def _fused(runs: list[_Run]) -> dict | None:
    """The `fused` field of the records: null for a separate run, else the group (an id its rerun reproduces)."""
    if len(runs) == 1:
        return None
    digest = hashlib.sha256(" ".join(sorted(run.label for run in runs)).encode()).hexdigest()[:10]
    return {"group": digest, "size": len(runs)}


def _identity(cfg: DictConfig, digest: str) -> dict:
    return {
        "schema": SCHEMA, "method": cfg.method.name, "variant": variant_name(cfg), "protocol": protocol_name(cfg),
        "task": cfg.task.name,
        "k": cfg.k, "seed": cfg.seed, "model_seed": cfg.model_seed, "model": model_identity(cfg.model.name),
        "status": None, "error": None, "data_dir": data_location(cfg.data.dir),
        "config": container(cfg), "identity": semantic_config(cfg), "config_hash": digest,
        "versions": versions(), "started_at": utc_now(),
    }


def resolve_device(cfg: DictConfig, training: bool = True) -> tuple[torch.device, bool]:
    """The device, and whether to autocast to bf16 (CUDA with bf16 support, unless precision says otherwise).
    Training in bf16 on a CPU is refused (config.CPU_BF16: check_config refuses device=cpu, this device=auto on a
    machine without CUDA); rescoring a saved bf16 run there (training=False) is not."""
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
    if training and cfg.precision == "bf16" and device.type == "cpu":
        raise UserError(CPU_BF16)
    return device, cfg.precision == "bf16"


def use_allocated_cpus() -> None:
    """Under SLURM, use the CPUs the job was given, not every core of the node: jobs sharing a node would
    otherwise oversubscribe it, and PyTorch's thread pools slow down badly when they do."""
    allocated = os.environ.get("SLURM_CPUS_PER_TASK")
    if allocated and allocated.isdigit() and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(int(allocated))


@dataclass
class LoadedRun:
    """A finished run rebuilt from its folder: its config (with where its model and data were found), record, and
    model on the backbone (`load_run`)."""

    cfg: DictConfig
    record: dict
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    bf16: bool
    run_dir: Path | None = None

    def predict(self, split: str = "test") -> tuple[dict, np.ndarray]:
        """Score the run's test (or dev) rows with the loaded model, as the run did: (scores, predictions)."""
        task = TaskSpec.from_config(self.cfg.task)
        data_dir = self.cfg.data.dir
        if data_dir is not None and not Path(data_dir).is_dir():
            raise UserError(f"{self.run_dir}: its data {data_dir} is not there: pass load_run(run_dir, "
                            f"data_dir=DIR) the data directory the run used")
        member, data = prepare_member(self.cfg, task, self.tokenizer, self.record.get("variant", ""))
        if self.record.get("test_examples") not in (None, data["test_examples"]):
            raise UserError(f"{data_dir or 'the Hub'}: {task.name}'s test split has {data['test_examples']} rows where "
                            f"the run's had {self.record['test_examples']}: not the data the run used (pass "
                            f"load_run(run_dir, data_dir=DIR) the data directory it used)")
        group = group_settings(self.cfg, self.model, self.tokenizer.pad_token_id, self.device, self.bf16)
        evaluation = EvaluationSet(member.test if split == "test" else member.dev, group)
        scores, _, outputs = evaluate(self.model, [evaluation], task, group, split, keep=True)
        return scores[0], predicted(outputs[0], task)


def load_run(run_dir: str | Path, device: str | None = None, *, data_dir: str | Path | None = None,
             model: str | Path | None = None) -> LoadedRun:
    """Rebuild a run saved with save.weights=true on its backbone: its record's config, the method's modules, and
    the trained tensors from weights.safetensors. `LoadedRun.predict()` rescores its test set.

    The model and data are found where the record says they were, as absolute paths (a copied run folder loads
    from anywhere); `model=` (a checkpoint directory or Hub id) and `data_dir=` (the run's data.dir: a GLUE copy, or
    the folder its task file's relative files are under) say where they are instead.
    """
    run_dir = Path(run_dir)
    record = _read_saved_record(run_dir)
    code = [line for line in changed_meaning(record) if line.startswith("the code of ")]
    if code:  # a user's component changed since: its modules may not be the ones the weights were trained in
        raise UserError(f"{run_dir}: made by other code than this Python's ({'; '.join(code)}): install the code "
                        f"that made it to load it")
    cfg = OmegaConf.create(record["config"])
    tensors, metadata = read_weights(run_dir)
    check_owner(run_dir / WEIGHTS, metadata, record)
    cfg.model.name = str(model) if model is not None else _saved_model(record, run_dir)
    cfg.data.dir = _saved_data_dir(record) if data_dir is None else data_location(data_dir)
    if device is not None:
        cfg.device = device
    task = TaskSpec.from_config(cfg.task)
    device_, bf16 = resolve_device(cfg, training=False)  # a bf16 run from a GPU is rescored as it ran
    try:
        built = group_model([cfg], task, device_)
    except UserError as error:
        raise UserError(f"{error} (load_run(run_dir, model=...) says where the run's model is)") from None
    _put_weights(built, tensors, run_dir, record, model)
    return LoadedRun(cfg, record, built, load_tokenizer(cfg.model.name), device_, bf16, run_dir)


def _put_weights(model, tensors: dict[str, torch.Tensor], run_dir: Path, record: dict, override) -> None:
    """Load a run's tensors into member 0 of `model`, once they are found to fit it (a UserError naming the file)."""
    shapes = {name: tuple(tensor.shape) for name, tensor in {**member_state(model, 0), **member_head(model, 0)}.items()}
    try:
        check_shapes(run_dir / WEIGHTS, tensors, shapes)
    except UserError as error:
        if override is None:
            raise
        raise UserError(f"{error}: is model={override} the run's backbone ({record.get('model')})?") from None
    device = model.head.out.weight.device
    tensors = {name: tensor.to(device) for name, tensor in tensors.items()}
    load_member_state(model, 0, tensors)
    load_member_head(model, 0, tensors)
    model.eval()


def _read_saved_record(run_dir: Path) -> dict:
    try:
        record = json.loads((run_dir / "result.json").read_text())
        OmegaConf.create(record["config"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{run_dir}: no readable result.json ({error})") from None
    if record.get("status") != "ok":
        raise UserError(f"{run_dir}: the run did not finish (status {record.get('status')}): nothing to load")
    return record


def _saved_model(record: dict, run_dir: Path) -> str:
    """The record's model: a Hub id, or a local checkpoint as its real absolute path (`model`, record.model_identity)."""
    name = str(record.get("model") or record["config"]["model"]["name"])
    if os.path.isabs(name) and not os.path.isdir(name):
        raise UserError(f"{run_dir}: its model {name} is not there: pass load_run(run_dir, model=DIR) the checkpoint "
                        f"directory the run used (or its Hub id)")
    return name


def _saved_data_dir(record: dict) -> str | None:
    """The record's GLUE directory as an absolute path (null: the Hub). Records from before the `data_dir` field
    have it in `data_source` (`tsv:DIR/RTE`, `parquet:DIR/rte`)."""
    if "data_dir" in record:
        return record["data_dir"]
    kind, _, place = str(record.get("data_source") or "").partition(":")
    if kind in ("tsv", "parquet") and os.path.isabs(place):
        return str(Path(place).parent)
    return data_location(record["config"]["data"]["dir"])
