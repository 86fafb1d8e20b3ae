"""Paired comparisons per cell (task × K) with a reference method: paired.md / paired.csv.

Every method of a cell ran on the same data seeds, so its runs pair with the reference's seed by seed. Over the
seeds both have a score: the paired t-test (scipy.stats.ttest_rel; n/a when every difference is the same, as
scipy's infinite t would read p = 0) and the exact sign-flip permutation test (all
2^n sign patterns of the n per-seed differences; two-sided, |mean| at least the observed one). An exact test over n
pairs cannot give a p-value below 2 / 2^n: 0.0625 for 5 seeds, so no sign-flip result over 5 seeds can reach 0.05 and
the table says so instead of marking one. With fewer than 2 shared seeds (grids that ran different seeds) the
comparison falls back to Welch's unpaired t-test and says so. When both methods saved predictions, the
example-level tests of example_tests.py join the row: the paired bootstrap on the task's metric and, for accuracy only,
McNemar's test stratified by seed (the discordant examples of each seed). paired.md's header (ASSUMPTIONS) says what each test assumes.

The reference: the paper's comparison (§4.3), each UniPELT variant against the single method of highest mean in the
cell; or, with `--baseline METHOD`, every other method against METHOD.
"""
import itertools
import warnings

import numpy as np
import pandas as pd
from scipy.stats import ttest_ind, ttest_rel

from .example_tests import example_tests
from .names import SINGLE_METHODS, UNIPELT_SUBMODULES
from .scores import paper_order

ALPHA = 0.05
TESTS = ("paired", "welch")


def sign_flip_p(differences):
    """Exact two-sided sign-flip p-value of the mean of `differences` (NaN for none)."""
    differences = np.asarray(differences, dtype=float)
    if len(differences) == 0:
        return np.nan
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(differences))))
    means = np.abs(signs @ differences) / len(differences)
    observed = abs(differences.mean())
    return float(np.mean(means >= observed - 1e-9 * max(1.0, observed)))


def sign_flip_floor(n):
    """The smallest two-sided p-value an exact sign-flip test over n pairs can give: 2 / 2^n (1 for n = 0)."""
    return min(1.0, 2.0 / 2 ** n)


def seed_test(ours, theirs):
    """{test, n, seeds, difference, t_p, sign_flip_p, sign_flip_floor} for two {seed: score} maps."""
    shared = sorted(set(ours) & set(theirs))
    if len(shared) >= 2:
        differences = np.array([ours[seed] - theirs[seed] for seed in shared])
        # equal differences have no variance: scipy's t is infinite (p = 0), which no reader should take as evidence
        t_p = np.nan if np.ptp(differences) == 0 else _quiet(lambda: ttest_rel(
            [ours[s] for s in shared], [theirs[s] for s in shared]).pvalue)
        return {"test": "paired", "n": len(shared), "seeds": " ".join(map(str, shared)),
                "difference": float(differences.mean()), "t_p": t_p,
                "sign_flip_p": sign_flip_p(differences), "sign_flip_floor": sign_flip_floor(len(shared))}
    mine, other = list(ours.values()), list(theirs.values())
    welch = _quiet(lambda: ttest_ind(mine, other, equal_var=False).pvalue) if len(mine) >= 2 and len(other) >= 2 else np.nan
    return {"test": "welch", "n": min(len(mine), len(other)), "seeds": "",
            "difference": float(np.mean(mine) - np.mean(other)) if mine and other else np.nan,
            "t_p": welch, "sign_flip_p": np.nan, "sign_flip_floor": np.nan}


def _quiet(compute):
    """scipy warns when the differences are (nearly) constant; its p-value (NaN for none) is still the answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(compute())


def comparisons(runs, baseline=None):
    """(k, task, method, reference) for each comparison among `runs` (default settings, one record per seed)."""
    usable = runs[(runs["status"] == "ok") & runs["main"].notna()]
    means = usable.groupby(["k", "task", "method"])["main"].mean()
    pairs = []
    for (k, task), cell in means.groupby(level=["k", "task"], sort=False):
        methods = cell.droplevel(["k", "task"])
        if baseline is not None:
            if baseline in methods.index:
                pairs += [(k, task, method, baseline) for method in methods.index if method != baseline]
            continue
        singles = methods[methods.index.isin(SINGLE_METHODS)]
        if singles.empty:
            continue
        pairs += [(k, task, method, singles.idxmax()) for method in methods.index if method in UNIPELT_SUBMODULES]
    return pairs


def paired_table(runs, baseline=None, alpha=ALPHA):
    """One row per comparison: the seed-level tests and, where predictions were saved, the example-level ones."""
    usable = runs[(runs["status"] == "ok") & runs["main"].notna()]
    rows = []
    for k, task, method, reference in comparisons(runs, baseline):
        cell = usable[(usable["k"] == k) & (usable["task"] == task)]
        ours, theirs = cell[cell["method"] == method], cell[cell["method"] == reference]
        row = {"k": k, "task": task, "method": method, "reference": reference,
               **seed_test(dict(zip(ours["seed"], ours["main"])), dict(zip(theirs["seed"], theirs["main"])))}
        row["significant"] = bool(row["t_p"] < alpha)
        task_config = ours["config"].iloc[0].get("task") or {}
        if task_config.get("main_metric"):  # the metric the bootstrap recomputes from predictions
            row.update(example_tests(dict(zip(ours["seed"], ours["path"])), dict(zip(theirs["seed"], theirs["path"])),
                                     task_config["main_metric"], task_config.get("num_labels") == 1))
        rows.append(row)
    return paper_order(pd.DataFrame(rows, columns=_columns(rows))).reset_index(drop=True)


def _columns(rows):
    first = ["k", "task", "method", "reference", "test", "n", "seeds", "difference", "t_p", "sign_flip_p",
             "sign_flip_floor", "significant"]
    return first + [key for key in dict.fromkeys(key for row in rows for key in row) if key not in first]


def check_baseline(runs, baseline):
    """A --baseline no compared run has is bad input: one line, before anything is written."""
    if baseline is not None and baseline not in set(runs["method"]):
        from .. import UserError

        found = ", ".join(sorted(set(runs["method"]))) or "none"
        raise UserError(f"--baseline {baseline}: no compared run of that method (default settings, or the setting "
                        f"chosen with --select); methods: {found}")


MCNEMAR_TESTS = {"chi2": "χ²", "mid-p": "mid-p", "none": "no discordant pair"}
METRIC_NAMES = {"accuracy": "Acc", "mcc": "MCC", "f1": "F1", "f1_macro": "Macro-F1", "spearman": "Spearman",
                "pearson": "Pearson"}

def pairing(tasks=()):
    """paired.md's first assumption: what is paired with what, the test set named for `tasks` (reported_set)."""
    from .captions import reported_set

    return ("What is paired with what. A data seed fixes the K training examples and the dev examples sampled from the "
            "train split (K = all: the seed only names the run); every method of a cell ran on the same seeds, so a "
            "method's run pairs with the reference's run of the same seed. The test examples are the rows of "
            f"{reported_set(tasks)}, the same in every seed.")


ASSUMPTIONS = [
    f"- **Over seeds** (`t p`, `sign-flip p`): the unit is a seed, its datum the difference of the two runs' scores on "
    f"the task's metric. `t p`: the paired t-test (scipy.stats.ttest_rel, two-sided, `*` when < {ALPHA}); assumes "
    "independent seeds and roughly normal differences. `sign-flip p`: the exact permutation test over all 2^n sign "
    "patterns of the n differences (two-sided: |mean| at least the observed); assumes only that each difference is "
    "as likely to be negative as positive under no effect; its smallest possible value is 2/2^n (`floor`): 0.0625 with "
    f"5 seeds, so with 5 seeds or fewer it cannot reach {ALPHA} and no star is given for it. `welch`: fewer than 2 "
    "shared seeds, Welch's unpaired t-test. These are the tests about training a method again on a new seed.",
    "- **Over examples** (runs that saved predictions, over the seeds both saved): a paired bootstrap on the task's "
    "own metric (MCC for CoLA, F1 for MRPC and QQP, Spearman for STS-B, accuracy otherwise). Each replicate resamples "
    "the test examples with replacement, the same examples for both methods and for every seed (an example takes "
    "its predictions of every seed with it; seeds whose examples differ draw their own), scores each seed's resample and averages method − reference over the "
    "seeds; 2,000 replicates from RNG seed 0. The interval: the replicates' 2.5th and 97.5th percentiles. p: "
    "min(1, 2 × the smaller share of replicates at or below 0 or at or above 0), two-sided; when no replicate "
    "crosses 0 it reads `< 2/B` (`< 0.001` for B = 2,000: one replicate across 0 would give 2/B), never 0. Assumes the examples are exchangeable draws "
    "of the task's inputs; the trained runs are held fixed, so it says whether these runs differ on this task's "
    "inputs, not whether a new seed would.",
    "- **McNemar, stratified by seed** (accuracy tasks only: it counts right answers, so it never stands in for MCC "
    "or F1): the paired test on the answers themselves. Per seed, b = the examples only the method got right, c = "
    "only the reference (the discordant pairs; examples both got right or both wrong say nothing about which is "
    "better); their sums over the seeds, B and C, are the table's b / c. Under no difference each discordant example is as "
    "likely to go either way. With 25 or more discordant pairs: (B − C)² / (B + C) against chi² with 1 degree of "
    "freedom, no continuity correction (`χ²`); with fewer, the mid-p binomial test (`mid-p`), which holds its size "
    "where the chi² approximation does not and is less conservative than the exact test (Fagerland, Lydersen & Laake "
    "2013). It assumes independent examples within a seed and independent seeds; the seeds answer the same dev rows, "
    "so where an example favours one method in every seed it counts once per seed and the p is optimistic: the "
    "bootstrap, which resamples an example with all its seeds, is the check.",
]


def bootstrap_p(value, replicates):
    """A bootstrap p-value as written: `< 2/B` when no replicate crossed 0 (the smallest p above 0 that B replicates
    give is 2/B: one replicate across 0, doubled by the two-sided formula)."""
    from .formatting import MISSING, is_missing

    if is_missing(value):
        return MISSING
    if value == 0:
        return f"< {2 / int(replicates):.2g}"
    return f"{value:.3g}"


def paired_markdown(results, baseline, caption, tasks=()):
    """paired.md: what is compared with what (the test set named for `tasks`: the compared runs'), the seed-level
    tests, and the example-level ones where predictions exist."""
    from .formatting import MISSING, is_missing, number, signed
    from .markdown import frame_markdown
    from .names import k_label, method_label, task_label

    def p(value):
        return MISSING if is_missing(value) else f"{value:.3g}"

    reference = (f"every method against {method_label(baseline)} (--baseline)" if baseline else
                 "each UniPELT variant against the single method of highest mean in its cell (the paper's §4.3 comparison)")
    parts = [f"# Paired comparisons: {reference}", "", caption, "", pairing(tasks), "", *ASSUMPTIONS, ""]
    if results.empty:
        return "\n".join(parts + ["No cell has both methods of a comparison.", ""])
    has = (lambda column: column in results and results[column].notna().any())
    table = pd.DataFrame({
        "K": results["k"].map(k_label), "Task": results["task"].map(task_label),
        "Method": results["method"].map(method_label), "Reference": results["reference"].map(method_label),
        "seeds": [f"{test} n={n}" for test, n in zip(results["test"], results["n"])],
        "difference": results["difference"].map(signed),
        "t p": [p(value) + (" *" if flag else "") for value, flag in zip(results["t_p"], results["significant"])],
        "sign-flip p (floor)": [MISSING if is_missing(v) else f"{p(v)} ({p(f)})"
                                for v, f in zip(results["sign_flip_p"], results["sign_flip_floor"])],
    })
    if has("bootstrap_difference"):
        table["examples: metric, difference [95% CI], p"] = [
            MISSING if is_missing(d) else f"{METRIC_NAMES.get(m, m)}, {signed(d)} [{number(lo)}, {number(hi)}], "
                                          f"{bootstrap_p(bp, b)}"
            for m, d, lo, hi, bp, b in zip(results["bootstrap_metric"], results["bootstrap_difference"],
                                           results["bootstrap_ci_low"], results["bootstrap_ci_high"],
                                           results["bootstrap_p_value"], results["bootstrap_replicates"])]
    if has("mcnemar_p_value"):
        table["accuracy, McNemar stratified by seed: b / c, p (test)"] = [
            MISSING if is_missing(mp) else f"{int(b)} / {int(c)}, {p(mp)} ({MCNEMAR_TESTS.get(test, test)})"
            for b, c, mp, test in zip(results["mcnemar_only_method"], results["mcnemar_only_reference"],
                                      results["mcnemar_p_value"], results["mcnemar_test"])]
    return "\n".join(parts + [frame_markdown(table), ""])


def write_paired(out, runs, render, baseline=None):
    """paired.md / paired.csv from the compared runs (default settings, or those --select chose); index entries."""
    results = paired_table(runs, baseline)
    out.csv("paired.csv", results)
    caption = " ".join(filter(None, [render.selected, render.selection.caption()]))  # --select: chosen on dev, said
    out.text("paired.md", paired_markdown(results, baseline, caption, sorted(set(runs["task"]))))
    chosen = f" (settings chosen on dev: --select {render.select_label})" if render.select_label else ""
    return [("paired.md / .csv", "paired comparisons per task and K with the reference method: over data seeds "
                                 "(paired t-test, exact sign-flip) and, where predictions were saved, over test examples"
                                 + chosen)]
