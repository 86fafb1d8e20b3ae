"""The full grid against the same grid under successive halving, from their records (docs/fused.md, "Successive halving").

    python scripts/compare_halving.py FULL_RESULTS HALVING_RESULTS [--times TIMES_TSV] [--first R0 ...]

Per method × task × K: the learning rate each grid chooses (the highest mean best-epoch dev score over the seeds; under
halving only among the candidates it did not prune: peltbench-tables --select method.lr), whether they agree, the test
mean of each choice and their difference where they do not, and the compute of each grid: epochs trained (summed over
runs), dev evaluations (= epochs under an epoch protocol) and test passes. With --times (scripts/halving_grid.sh's
times.tsv: grid, task, K, method, wall, user, sys seconds per sweep) the wall and CPU (user + sys) time of each sweep.
Also checks every pruning decision against the records (peltbench.halving's rule) and says how many it recomputed.

With --first R0 ...: what halving (η of the halving grid) with its first rung at each R0 (`halving_first`) would choose,
replayed from the full grid's records alone (peltbench.halving.replay: exact, since a member's history does not depend
on when the others stop; r0 = 1 is checked against the halving grid's own decisions): per cell the lr, its test
difference to the full grid's choice, and the epochs trained.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from peltbench.halving import candidate_score, decide, replay, rungs, seed_score


def load(results: Path) -> dict[tuple, list[dict]]:
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for path in sorted(results.rglob("result.json")):
        record = json.loads(path.read_text())
        cells[(record["method"], record["task"], record["k"])].append(record)
    return cells


def choose(records: list[dict]) -> tuple[float | None, dict[float, dict]]:
    """The chosen lr and, per lr, (dev mean, test mean, pruned rung) over the seeds."""
    by_lr: dict[float, list[dict]] = defaultdict(list)
    for record in records:
        by_lr[record["config"]["method"]["lr"]].append(record)
    rows = {}
    for lr, runs in by_lr.items():
        dev = [r["dev_best"]["main"] for r in runs if r.get("dev_best")]
        test = [r["test"]["main"] for r in runs if r.get("test")]
        pruned = [r["pruned"]["rung"] for r in runs if r["status"] == "pruned"]
        rows[lr] = {"dev": sum(dev) / len(dev) if dev else math.nan,
                    "test": sum(test) / len(test) if len(test) == len(runs) else math.nan,
                    "pruned": max(pruned) if pruned else None}
    trained = [lr for lr, row in rows.items() if row["pruned"] is None and not math.isnan(row["dev"])]
    chosen = max(trained, key=lambda lr: (rows[lr]["dev"], -lr)) if trained else None
    return chosen, rows


def candidates(records: list[dict]) -> dict[str, list[dict]]:
    """One cell's records by candidate (variant folder), each candidate's seeds in the order of their data seeds."""
    by_candidate: dict[str, list[dict]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r["variant"], r["seed"])):
        by_candidate[record["variant"]].append(record)
    return by_candidate


def check_decisions(records: list[dict]) -> int:
    """Recompute every rung of one bracket from the records; the number of rungs that decided something."""
    eta, first = records[0]["config"]["halving"], records[0]["config"].get("halving_first", 1)
    length = records[0]["config"]["train"]["epochs"]
    by_candidate = candidates(records)
    decided = 0
    for rung in rungs(eta, length, first):
        def trains_on(record):
            if record["status"] == "pruned":
                return record["pruned"]["rung"] >= rung
            return record["status"] == "ok" and record["epochs_run"] > rung
        live = [name for name, runs in by_candidate.items() if any(trains_on(r) for r in runs)]
        recorded = {r["variant"] for r in records if r["status"] == "pruned" and r["pruned"]["rung"] == rung}
        if len(live) < 2:
            assert not recorded, f"rung {rung}: pruned {recorded} with fewer than two live candidates"
            continue
        scores = {name: candidate_score([seed_score(r["history"], rung) for r in by_candidate[name]]) for name in live}
        _, pruned = decide(scores, eta)
        assert set(pruned) == recorded, f"rung {rung}: the rule prunes {sorted(pruned)}, the records say {sorted(recorded)}"
        decided += 1
    return decided


def replayed(records: list[dict], rows: dict[float, dict], eta: int, first: int) -> tuple[dict[float, int], float, int]:
    """Halving (η, r0 = first) replayed from a full grid's records of one cell (`rows`: `choose`'s, of those records):
    {lr: pruned rung}, the lr it chooses among the survivors (as `choose`), and the epochs it trains."""
    by_candidate = candidates(records)
    length = records[0]["config"]["train"]["epochs"]
    pruned = replay({name: [r["history"] for r in runs] for name, runs in by_candidate.items()}, eta, length, first)
    lr_of = {name: runs[0]["config"]["method"]["lr"] for name, runs in by_candidate.items()}
    chosen = max((lr_of[name] for name in by_candidate if name not in pruned), key=lambda lr: (rows[lr]["dev"], -lr))
    epochs = sum(pruned.get(r["variant"], r.get("epochs_run") or 0) for r in records)
    return {lr_of[name]: rung for name, rung in pruned.items()}, chosen, epochs


def compute(records: list[dict]) -> dict[str, int]:
    epochs = sum(r.get("epochs_run") or 0 for r in records)
    return {"epochs": epochs, "dev": epochs, "test": sum(r["status"] == "ok" for r in records)}


def times(path: Path | None) -> dict[tuple, tuple[float, float]]:
    out = {}
    if path is None:
        return out
    for row in csv.reader(path.open(), delimiter="\t"):
        grid, task, k, method, wall, user, system = row
        out[(grid, task, int(k), method)] = (float(wall), float(user) + float(system))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("full", type=Path)
    parser.add_argument("halving", type=Path)
    parser.add_argument("--times", type=Path, action="append", default=[])
    parser.add_argument("--first", type=int, nargs="+", default=[], metavar="R0")
    args = parser.parse_args()
    full, halved = load(args.full), load(args.halving)
    timing = {}
    for path in args.times:
        timing.update(times(path))
    print("| task | K | method | lr: full grid | lr: halving=3 (pruned at rungs) | same lr | test: full | test: halving "
          "| Δ test | epochs (= dev evaluations): full / halving | test passes | wall s: full / halving | CPU s: full / halving |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    totals = defaultdict(float)
    checked, survivors, worst = 0, 0, 0.0
    unfinished = []
    for cell in sorted(set(full) & set(halved), key=lambda c: (c[1], c[2], c[0])):
        method, task, k = cell
        if len(halved[cell]) < len(full[cell]):  # a sweep still running: its survivors have no record yet
            unfinished.append(f"{task} K={k} {method}")
            continue
        lr_full, rows_full = choose(full[cell])
        lr_half, rows_half = choose(halved[cell])
        checked += check_decisions(halved[cell])
        same_runs = {(r["variant"], r["seed"]): r for r in full[cell]}
        for record in halved[cell]:  # a survivor's record against the same run in the full grid
            if record["status"] == "ok":
                twin = same_runs[(record["variant"], record["seed"])]
                survivors += 1
                worst = max(worst, abs(record["test"]["main"] - twin["test"]["main"]),
                            abs(record["dev_best"]["main"] - twin["dev_best"]["main"]))
        pruned = ", ".join(f"{lr:g}@{row['pruned']}" for lr, row in sorted(rows_half.items()) if row["pruned"])
        same = lr_full == lr_half
        test_full, test_half = rows_full[lr_full]["test"], rows_half[lr_half]["test"]
        c_full, c_half = compute(full[cell]), compute(halved[cell])
        wall_full, cpu_full = timing.get(("full", task, k, method), (math.nan, math.nan))
        wall_half, cpu_half = timing.get(("halving", task, k, method), (math.nan, math.nan))
        for key, value in (("epochs_full", c_full["epochs"]), ("epochs_half", c_half["epochs"]),
                           ("test_full", c_full["test"]), ("test_half", c_half["test"]), ("wall_full", wall_full),
                           ("wall_half", wall_half), ("cpu_full", cpu_full), ("cpu_half", cpu_half), ("same", same),
                           ("cells", 1)):
            totals[key] += value
        print(f"| {task} | {k} | {method} | {lr_full:g} | {lr_half:g} ({pruned}) | {'yes' if same else 'no'} "
              f"| {test_full:.2f} | {test_half:.2f} | {test_half - test_full:+.2f} | {c_full['epochs']} / {c_half['epochs']} "
              f"| {c_full['test']} / {c_half['test']} | {wall_full:.0f} / {wall_half:.0f} | {cpu_full:.0f} / {cpu_half:.0f} |")
    print(f"| all | | {int(totals['cells'])} cells | | | {int(totals['same'])} of {int(totals['cells'])} | | | "
          f"| {int(totals['epochs_full'])} / {int(totals['epochs_half'])} "
          f"({totals['epochs_half'] / totals['epochs_full']:.2f}) | {int(totals['test_full'])} / {int(totals['test_half'])} "
          f"| {totals['wall_full']:.0f} / {totals['wall_half']:.0f} ({totals['wall_half'] / totals['wall_full']:.2f}) "
          f"| {totals['cpu_full']:.0f} / {totals['cpu_half']:.0f} ({totals['cpu_half'] / totals['cpu_full']:.2f}) |")
    if unfinished:
        print(f"\nLeft out, their halving grid unfinished (fewer records than the full grid's): {', '.join(unfinished)}.")
    print(f"\n{checked} rung decisions recomputed from the halving grid's records: all agree with the rule.")
    print(f"{survivors} survivors' runs against the same runs of the full grid: test and best dev scores differ by at "
          f"most {worst:.4f} points.")
    if args.first:
        print_replays(full, halved, args.first)


def print_replays(full: dict, halved: dict, firsts: list[int]) -> None:
    """The table of --first: each cell of the full grid under halving with each first rung, replayed."""
    cells = sorted(full, key=lambda c: (c[1], c[2], c[0]))
    measured = {c for c in cells if c in halved and len(halved[c]) == len(full[c])}  # a halving grid to check against
    etas = {halved[c][0]["config"]["halving"] for c in measured}
    assert len(etas) <= 1, f"halving grids with several η: {etas}"
    eta = etas.pop() if etas else 3
    print(f"\nReplayed from the full grid's records, halving={eta} with its first rung at r0 (halving_first); "
          f"* a cell without a halving grid to check r0 = 1 against:")
    print("| task | K | method | lr: full grid | " + " | ".join(f"r0 = {r}: lr (Δ test), epochs" for r in firsts) + " |")
    print("|---|---|---|---|" + "---|" * len(firsts))
    totals = {r: defaultdict(float) for r in firsts}
    for cell in cells:
        method, task, k = cell
        lr_full, rows = choose(full[cell])
        row = []
        for r in firsts:
            pruned, lr, epochs = replayed(full[cell], rows, eta, r)
            if r == 1 and cell in measured:  # the replay against the halving grid's own decisions
                recorded = {rec["config"]["method"]["lr"]: rec["pruned"]["rung"] for rec in halved[cell]
                            if rec["status"] == "pruned"}
                assert pruned == recorded and lr == choose(halved[cell])[0], f"{cell}: replay {pruned}, grid {recorded}"
            delta = rows[lr]["test"] - rows[lr_full]["test"]
            for key, value in (("same", lr == lr_full), ("epochs", epochs), ("full", compute(full[cell])["epochs"]),
                               ("delta", delta), ("cells", 1)):
                totals[r][key] += value
            totals[r]["worst"] = min(totals[r]["worst"], delta)
            row.append(f"{lr:g} ({delta:+.2f}), {epochs}")
        print(f"| {task} | {k}{'' if cell in measured else '*'} | {method} | {lr_full:g} | " + " | ".join(row) + " |")
    print(f"| all | | {int(totals[firsts[0]]['cells'])} cells | | " + " | ".join(
        f"same lr {int(t['same'])} of {int(t['cells'])}; Δ test: mean {t['delta'] / t['cells']:+.2f}, worst "
        f"{t['worst']:+.2f}; epochs {int(t['epochs'])} / {int(t['full'])} ({t['epochs'] / t['full']:.2f})"
        for t in totals.values()) + " |")
    if 1 in firsts:
        print(f"(r0 = 1 replayed equals the halving grid's decisions in each of the {len(measured)} cells that have one.)")


if __name__ == "__main__":
    main()
