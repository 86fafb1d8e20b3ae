"""Successive halving in fused grids (`halving=η`, off by default; docs/protocol.md §11, docs/fused.md).

In a fused group, the runs of one *bracket* (the same method × task × K × everything else, differing only in
`method.*` settings and the data seed) are compared at *rungs*: after dev evaluation r₀, r₀η, r₀η², ... (epochs,
or evaluations under a step-based protocol; r₀ = `halving_first`, 1 by default), while below the run's length. A
*candidate* is one setting of the method (one variant folder); its runs are its data seeds. At a rung the live
candidates are ranked by the mean, over their seeds in the group, of each seed's best dev score so far (the score the
protocol selects on); the top ceil(n/η) (at least one) train on, the others stop, all their seeds, with a `pruned`
record (no test score).

Every comparison is written to a ledger (`<results_dir>/.halving/<bracket>.json`) before any pruned record, so a
sweep killed mid-rung and run again replays the recorded comparisons instead of deciding again among fewer
candidates, and reaches the same survivors and the same records. The rule, so a decision can be recomputed from the
records alone (`candidate_score`, `decide`):

- a seed's score at rung r: the largest `dev_main` of its first r history entries, as the record rounds it (4
  decimals); None (an undefined metric) or a seed that diverged (no entries, a failed record) is NaN;
- a candidate's score: the mean of its seeds' scores (its seeds in the group, in the order of their data seeds),
  NaN if any is NaN; seeds that stopped early (patience) count with their final best;
- live candidates: those with a seed still training after the rung (not stopping there); only they are ranked;
- ranking: by score, highest first, NaN last, ties by the candidate's name (its variant folder), ascending;
- kept: the first max(1, ceil(n/η)); a comparison needs at least two live candidates.

This module sits between record and runner: train.fit calls the hook the runner builds (`Halving`), nothing more.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from .files import folder_lock, write_file
from .record import read_record, semantic_config, variant_name

log = logging.getLogger("peltbench")

LEDGER_DIR = ".halving"  # under results_dir: one JSON ledger per bracket (hidden: no variant folder starts with '.')
STATUS = "pruned"        # a pruned run's record status


def eta(cfg: DictConfig) -> int | None:
    """The run's halving η, or None when halving is off."""
    value = cfg.get("halving")
    return None if value in (None, False) else int(value)


def first_rung(cfg: DictConfig) -> int:
    """The run's first rung r₀ (`halving_first`): the evaluation of the first comparison."""
    return int(cfg.get("halving_first") or 1)


def bracket_identity(cfg: DictConfig) -> dict:
    """What the candidates of one comparison share: the run's identity without its method settings (the method's
    name stays), data seed and model seed."""
    identity = semantic_config(cfg)
    identity["method"] = {"name": cfg.method.name}
    identity.pop("seed", None)
    identity.pop("model_seed", None)
    return identity


def bracket_id(cfg: DictConfig) -> str:
    """The bracket's ledger name: its task, K and method, then a hash of its identity, η and r₀ (r₀ = 1, the default,
    is left out: ledgers from before `halving_first` keep their name)."""
    key = {"bracket": bracket_identity(cfg), "eta": eta(cfg)}
    first = first_rung(cfg)
    if first != 1:
        key["first"] = first
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    return f"{cfg.task.name}-k{cfg.k}-{cfg.method.name}-eta{eta(cfg)}{f'-first{first}' if first != 1 else ''}-{digest}"


def candidate_name(cfg: DictConfig) -> str:
    """A candidate: one variant folder (the method's settings) of the bracket."""
    return variant_name(cfg)


def rungs(eta_: int, length: int, first: int = 1) -> list[int]:
    """The rungs of a run `length` evaluations long: r₀ = `first`, r₀η, r₀η², ... below `length`."""
    out, rung = [], first
    while rung < length:
        out.append(rung)
        rung *= eta_
    return out


def seed_score(history: Sequence[dict], rung: int) -> float:
    """A seed's score at `rung`: its best dev_main over its first `rung` evaluations, rounded as its record keeps it
    (NaN when it has none, or when any of them is undefined and none is defined)."""
    values = [entry.get("dev_main") for entry in list(history)[:rung]]
    values = [round(v, 4) for v in values if v is not None and math.isfinite(v)]
    return max(values) if values else math.nan


def candidate_score(seed_scores: Sequence[float]) -> float:
    """The mean of a candidate's seed scores (in the order of their data seeds); NaN if any is NaN."""
    if not seed_scores or any(math.isnan(s) for s in seed_scores):
        return math.nan
    return sum(seed_scores) / len(seed_scores)


def decide(scores: dict[str, float], eta_: int) -> tuple[list[str], list[str]]:
    """(kept, pruned) candidates: the top max(1, ceil(n/η)) by score, NaN last, ties by name."""
    order = sorted(scores, key=lambda name: (math.isnan(scores[name]), -scores[name] if not math.isnan(scores[name])
                                             else 0.0, name))
    keep = max(1, math.ceil(len(order) / eta_))
    return order[:keep], order[keep:]


def replay(histories: dict[str, Sequence[Sequence[dict]]], eta_: int, length: int, first: int = 1) -> dict[str, int]:
    """The rung at which each candidate would be pruned ({name: rung}; the survivors are absent), from its seeds'
    histories of the whole run (`histories[name]`: one per seed, in the order of their data seeds), by the rule above.

    Exact, to float rounding, for a fused group trained without halving: a member's history does not depend on when
    the others stop (`tests/test_halving.py`), so this is what the same grid under halving (η, r₀) decides, and its
    survivors are these runs. `scripts/compare_halving.py --first` replays other first rungs from a full grid's records."""
    pruned: dict[str, int] = {}
    for rung in rungs(eta_, length, first):
        live = [name for name, seeds in histories.items() if name not in pruned and any(len(h) > rung for h in seeds)]
        if len(live) < 2:
            continue
        scores = {name: candidate_score([seed_score(h, rung) for h in histories[name]]) for name in live}
        pruned.update((name, rung) for name in decide(scores, eta_)[1])
    return pruned


def pruned_record(path: Path, cfg: DictConfig) -> dict | None:
    """The run's pruned record when halving is on (a pruned run is done for a halving sweep), else None."""
    if eta(cfg) is None:
        return None
    record = read_record(path)
    return record if record is not None and record.get("status") == STATUS else None


def ledger_path(results_dir: Path, cfg: DictConfig) -> Path:
    return results_dir / LEDGER_DIR / f"{bracket_id(cfg)}.json"


def read_ledger(path: Path) -> dict:
    try:
        ledger = json.loads(path.read_text())
    except FileNotFoundError:
        return {"rungs": {}}
    except (OSError, ValueError) as error:
        from . import UserError

        raise UserError(f"cannot read the halving ledger {path}: {error} (move it away to decide its rungs again)") \
            from None
    return ledger if isinstance(ledger, dict) and isinstance(ledger.get("rungs"), dict) else {"rungs": {}}


def add_comparison(path: Path, header: dict, rung: int, comparison: dict) -> None:
    """Append a comparison at `rung` to the ledger, whole (under the ledger folder's lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(path.parent):
        ledger = read_ledger(path)
        ledger.update(header)
        ledger.setdefault("rungs", {}).setdefault(str(rung), []).append(comparison)
        write_file(path, json.dumps(ledger, indent=1, sort_keys=False) + "\n", ".ledger.")


@dataclass
class _Slot:
    """A member of the group, as halving sees it."""

    candidate: str
    bracket: str
    seed: int
    ledger: Path
    header: dict
    length: int  # evaluations in the whole run


class Halving:
    """The hook train.fit calls after each dev evaluation: which members stop here, pruned, and why.

    `members`: per member of the group (its index), (config, ledger path, evaluations in the whole run); a member
    with halving off (None config) is never pruned.
    """

    def __init__(self, members: Sequence[tuple[DictConfig, Path, int] | None]) -> None:
        self.slots: list[_Slot | None] = []
        for entry in members:
            if entry is None or eta(entry[0]) is None:
                self.slots.append(None)
                continue
            cfg, path, length = entry
            header = {"bracket": bracket_id(cfg), "eta": eta(cfg), "first": first_rung(cfg),
                      "identity": bracket_identity(cfg), "rungs_planned": rungs(eta(cfg), length, first_rung(cfg))}
            self.slots.append(_Slot(candidate_name(cfg), bracket_id(cfg), int(cfg.seed), path, header, length))
        self.eta = {slot.bracket: slot.header["eta"] for slot in self.slots if slot is not None}

    def __bool__(self) -> bool:
        return any(slot is not None for slot in self.slots)

    def __call__(self, evaluation: int, histories: Sequence[Sequence[dict]], active: Sequence[int],
                 stopping: Sequence[int]) -> dict[int, dict]:
        """{member index: its `pruned` field} for the members that stop at this evaluation, pruned."""
        out: dict[int, dict] = {}
        for bracket in sorted(self.eta):
            out.update(self._rung(bracket, evaluation, histories, active, stopping))
        return out

    def _rung(self, bracket: str, rung: int, histories, active, stopping) -> dict[int, dict]:
        eta_ = self.eta[bracket]
        mine = [m for m, slot in enumerate(self.slots) if slot is not None and slot.bracket == bracket]
        header = self.slots[mine[0]].header
        if rung not in header["rungs_planned"]:
            return {}
        training = [m for m in mine if m in active and m not in stopping]  # train on after this rung unless pruned
        live = sorted({self.slots[m].candidate for m in training})
        if len(live) < 2 and not self._recorded(bracket, rung):
            return {}
        slot0 = self.slots[mine[0]]
        ledger = read_ledger(slot0.ledger)
        recorded = ledger["rungs"].get(str(rung), [])
        pruned_here: dict[str, dict] = {}
        compared = set()
        for comparison in recorded:  # replayed: a resumed sweep decides nothing it decided before
            compared.update(comparison["scores"])
            for position, name in enumerate(comparison["order"]):
                if name in comparison["pruned"]:
                    pruned_here[name] = self._field(comparison, name, position, rung, slot0, eta_)
        fresh = [name for name in live if name not in compared]
        if len(fresh) >= 2:
            comparison = self._compare(fresh, mine, histories, rung, eta_)
            add_comparison(slot0.ledger, slot0.header, rung, comparison)
            log.info("halving rung %d (%s): kept %s; pruned %s", rung, bracket, ", ".join(comparison["kept"]),
                     ", ".join(comparison["pruned"]))
            for position, name in enumerate(comparison["order"]):
                if name in comparison["pruned"]:
                    pruned_here[name] = self._field(comparison, name, position, rung, slot0, eta_)
        elif recorded and any(name in compared for name in live):
            log.info("halving rung %d (%s): replaying the recorded decision (%s)", rung, bracket, slot0.ledger)
        return {m: pruned_here[self.slots[m].candidate] for m in training if self.slots[m].candidate in pruned_here}

    def _recorded(self, bracket: str, rung: int) -> bool:
        slot0 = next(slot for slot in self.slots if slot is not None and slot.bracket == bracket)
        return bool(read_ledger(slot0.ledger)["rungs"].get(str(rung)))

    def _compare(self, names: list[str], mine: list[int], histories, rung: int, eta_: int) -> dict:
        seeds: dict[str, list[int]] = {}
        seed_scores: dict[str, list[float]] = {}
        for name in names:
            members = sorted((m for m in mine if self.slots[m].candidate == name), key=lambda m: self.slots[m].seed)
            seeds[name] = [self.slots[m].seed for m in members]
            seed_scores[name] = [seed_score(histories[m], rung) for m in members]
        scores = {name: candidate_score(seed_scores[name]) for name in names}
        kept, pruned = decide(scores, eta_)
        return {"scores": {name: (None if math.isnan(score) else score) for name, score in scores.items()},
                "seeds": seeds, "seed_scores": {name: [None if math.isnan(s) else s for s in values]
                                                for name, values in seed_scores.items()},
                "order": kept + pruned, "kept": kept, "pruned": pruned}

    @staticmethod
    def _field(comparison: dict, name: str, position: int, rung: int, slot: _Slot, eta_: int) -> dict:
        score = comparison["scores"].get(name)
        return {"rung": rung, "eta": eta_, "dev": score, "rank": position + 1, "of": len(comparison["order"]),
                "kept": len(comparison["kept"]), "bracket": slot.bracket, "ledger": f"{LEDGER_DIR}/{slot.ledger.name}"}
