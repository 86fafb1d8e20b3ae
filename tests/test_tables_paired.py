"""Paired comparisons (issue 20 item 3; McNemar stratified by seed: issue 32 item 2), each recomputed here with scipy,
independently, from synthetic records and from literal counts."""
import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from peltbench.tables.command import main
from peltbench.tables.example_tests import paired_bootstrap, replicate_scores, stratified_mcnemar
from peltbench.tables.paired import bootstrap_p, paired_table, seed_test, sign_flip_floor, sign_flip_p
from peltbench.tables.records import load_records
from test_tables import write_record

SEEDS = (111, 222, 333, 444, 555)
EXAMPLES = 200


def predictions(seed, skill):
    """Labels and predictions of 200 binary examples: right with probability `skill`, same labels for every seed."""
    labels = np.random.default_rng(0).integers(0, 2, EXAMPLES)
    right = np.random.default_rng(seed * 7 + int(skill * 100)).random(EXAMPLES) < skill
    return labels, np.where(right, labels, 1 - labels)


def write_runs(root, skills=(("unipelt_ap", 0.8), ("lora", 0.7), ("adapter", 0.6)), name="rte", metric="accuracy"):
    task = {"name": name, "main_metric": metric, "num_labels": 2}
    for method, skill in skills:
        for seed in SEEDS:
            labels, predicted = predictions(seed, skill)
            path = write_record(root, method, name, 100, seed, 100.0 * float(np.mean(labels == predicted)))
            record = path.read_text().replace(f'"task": {{"name": "{name}"}}', f'"task": {pd.Series(task).to_json()}')
            path.write_text(record)
            pd.DataFrame({"index": range(EXAMPLES), "label": labels, "prediction": predicted,
                          "logit_0": 0.0}).to_csv(path.parent / "predictions.csv", index=False)  # extra column: ignored
    return root


def cmh_by_formula(ours, theirs):
    """Cochran-Mantel-Haenszel, strata = seeds, each 2 x 2: method/reference x right/wrong; continuity-corrected (the
    test paired.md had before issue 32: it treats the two methods' answers as independent samples)."""
    excess = variance = 0.0
    for (labels, mine), (_, other) in zip(ours, theirs):
        table = np.array([[np.sum(mine == labels), np.sum(mine != labels)],
                          [np.sum(other == labels), np.sum(other != labels)]], dtype=float)
        rows, columns, total = table.sum(axis=1), table.sum(axis=0), table.sum()
        excess += table[0, 0] - rows[0] * columns[0] / total
        variance += rows[0] * rows[1] * columns[0] * columns[1] / (total ** 2 * (total - 1))
    return stats.chi2.sf((abs(excess) - 0.5) ** 2 / variance, df=1)


def test_sign_flip_is_scipys_exact_permutation_test_and_its_floor():
    differences = np.array([1.5, 2.0, -0.5, 3.0, 1.0])
    exact = stats.permutation_test((differences,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                   alternative="two-sided").pvalue
    assert sign_flip_p(differences) == pytest.approx(exact)
    assert sign_flip_p([1, 2, 3, 4, 5]) == sign_flip_floor(5) == 0.0625  # all positive: the smallest p there is
    assert min(sign_flip_p(np.array(signs) * [1, 2, 3, 4, 5]) for signs in itertools.product((1, -1), repeat=5)) == 0.0625


def test_seed_test_pairs_shared_seeds_and_falls_back_to_welch():
    ours, theirs = {111: 60.0, 222: 64.0, 333: 61.0}, {111: 58.0, 222: 60.0, 333: 60.5, 444: 70.0}
    paired = seed_test(ours, theirs)
    assert paired["test"] == "paired" and paired["n"] == 3 and paired["seeds"] == "111 222 333"
    assert paired["t_p"] == pytest.approx(stats.ttest_rel([60, 64, 61], [58, 60, 60.5]).pvalue)
    assert paired["sign_flip_floor"] == 0.25
    assert np.isnan(seed_test({111: 60.0, 222: 62.0}, {111: 58.0, 222: 60.0})["t_p"])  # +2 twice: no variance, n/a
    welch = seed_test({111: 60.0, 222: 64.0}, {333: 58.0, 444: 60.0})
    assert welch["test"] == "welch" and welch["t_p"] == pytest.approx(stats.ttest_ind([60, 64], [58, 60], equal_var=False).pvalue)


def test_example_tests_recomputed_with_scipy(tmp_path):
    runs = load_records(write_runs(tmp_path))
    results = paired_table(runs).set_index("method")
    row = results.loc["unipelt_ap"]
    assert row["reference"] == "lora"  # the best single method of the cell
    ours = [predictions(seed, 0.8) for seed in SEEDS]
    theirs = [predictions(seed, 0.7) for seed in SEEDS]
    scores = [100 * np.mean(l == p) for l, p in ours], [100 * np.mean(l == p) for l, p in theirs]
    assert row["t_p"] == pytest.approx(stats.ttest_rel(*scores).pvalue)
    # McNemar stratified by seed: b and c counted here per seed, the p from scipy's chi² (b + c >= 25)
    b = [int(np.sum((p == l) & (q != l))) for (l, p), (_, q) in zip(ours, theirs)]
    c = [int(np.sum((p != l) & (q == l))) for (l, p), (_, q) in zip(ours, theirs)]
    assert (row["mcnemar_only_method"], row["mcnemar_only_reference"]) == (sum(b), sum(c))
    assert row["mcnemar_per_seed"] == " ".join(f"{x}/{y}" for x, y in zip(b, c)) and row["mcnemar_test"] == "chi2"
    assert row["mcnemar_p_value"] == pytest.approx(stats.chi2.sf((sum(b) - sum(c)) ** 2 / (sum(b) + sum(c)), df=1))
    # the paired bootstrap: scipy's, resampling the same examples for every seed and both methods
    data = [array for (l, p), (_, q) in zip(ours, theirs) for array in (l, p, q)]

    def difference(*arrays, axis=-1):
        triples = [arrays[i:i + 3] for i in range(0, len(arrays), 3)]
        return np.mean([100 * (np.mean(l == p, axis=axis) - np.mean(l == q, axis=axis)) for l, p, q in triples], axis=0)

    reference = stats.bootstrap(data, difference, paired=True, vectorized=True, method="percentile",
                                n_resamples=4000, random_state=1).confidence_interval
    assert row["bootstrap_difference"] == pytest.approx(np.mean(scores[0]) - np.mean(scores[1]))
    assert row["bootstrap_ci_low"] == pytest.approx(reference.low, abs=0.5)
    assert row["bootstrap_ci_high"] == pytest.approx(reference.high, abs=0.5)


def test_the_bootstrap_and_mcnemar_on_a_known_case():
    labels = np.array([1, 0] * 50)
    same = (labels, labels, labels)
    assert paired_bootstrap("accuracy", [same])["difference"] == 0 and stratified_mcnemar([same])["p_value"] == 1.0
    f1 = paired_bootstrap("f1", [(labels, labels, 1 - labels)], replicates=200)
    assert f1["difference"] == 100 and f1["ci_low"] == f1["ci_high"] == 100 and f1["p_value"] == 0


# Literal answers of two methods on RTE's 277 test rows, per seed: (both right, only the method, only the reference,
# both wrong). B = 37, C = 26 discordant pairs; few: B = 6, C = 3.
MANY = ((170, 14, 9, 84), (165, 12, 10, 90), (172, 11, 7, 87))
FEW = ((180, 3, 1, 93), (181, 2, 0, 94), (180, 1, 2, 94))


def answers(both, only_method, only_reference, neither):
    """(labels, method's, reference's predictions) with those four counts; labels of both classes."""
    labels = np.tile([1, 0], 277)[:both + only_method + only_reference + neither]
    method_right = np.repeat([True, True, False, False], (both, only_method, only_reference, neither))
    reference_right = np.repeat([True, False, True, False], (both, only_method, only_reference, neither))
    return labels, np.where(method_right, labels, 1 - labels), np.where(reference_right, labels, 1 - labels)


def test_mcnemar_stratified_by_seed_on_literal_counts_is_scipys():
    """Issue 32 item 2: per seed b, c; B = 37, C = 26 is the chi² test (uncorrected); B = 6, C = 3 the mid-p test, each
    recomputed with scipy. The CMH test paired.md had said p = 0.61 on the first, treating the answers as unpaired."""
    many = stratified_mcnemar([answers(*counts) for counts in MANY])
    assert (many["only_method"], many["only_reference"], many["per_seed"]) == (37, 26, "14/9 12/10 11/7")
    assert many["test"] == "chi2" and many["statistic"] == pytest.approx(11 ** 2 / 63)
    assert many["p_value"] == pytest.approx(stats.chi2.sf(121 / 63, df=1)) == pytest.approx(0.16579, abs=1e-5)
    old = cmh_by_formula(*zip(*[((l, p), (l, q)) for l, p, q in (answers(*counts) for counts in MANY)]))
    assert old == pytest.approx(0.608, abs=1e-3)  # what the CMH test said on the same answers
    few = stratified_mcnemar([answers(*counts) for counts in FEW])
    assert (few["only_method"], few["only_reference"], few["test"]) == (6, 3, "mid-p")
    exact = stats.binomtest(6, 9, 0.5).pvalue  # the exact conditional test; mid-p = exact - P(X = 6)
    assert few["p_value"] == pytest.approx(exact - stats.binom.pmf(6, 9, 0.5)) == pytest.approx(0.3438, abs=1e-4)
    tie = stratified_mcnemar([answers(100, 2, 2, 10)])
    assert tie["test"] == "mid-p" and tie["p_value"] == pytest.approx(1.0)
    none = stratified_mcnemar([answers(100, 0, 0, 10)])
    assert none["test"] == "none" and none["p_value"] == 1.0


def write_answers(root, rows, method, task="rte"):
    """`method`'s records and predictions.csv on RTE, one seed per row of (labels, predictions)."""
    meta = {"name": task, "main_metric": "accuracy", "num_labels": 2}
    for seed, (labels, predicted) in zip(SEEDS, rows):
        path = write_record(root, method, task, 100, seed, 100.0 * float(np.mean(labels == predicted)))
        path.write_text(path.read_text().replace(f'"task": {{"name": "{task}"}}', f'"task": {pd.Series(meta).to_json()}'))
        pd.DataFrame({"index": range(len(labels)), "label": labels, "prediction": predicted}).to_csv(
            path.parent / "predictions.csv", index=False)


def test_paired_md_tests_accuracy_by_mcnemar_stratified_by_seed(tmp_path):
    """The render's row: UniPELT against LoRA on the literal answers above; paired.csv's p is scipy's chi²."""
    triples = [answers(*counts) for counts in MANY]
    write_answers(tmp_path / "runs", [(l, p) for l, p, _ in triples], "unipelt_ap")
    write_answers(tmp_path / "runs", [(l, q) for l, _, q in triples], "lora")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--seeds", "3"]) == 0
    row = pd.read_csv(out / "paired.csv").set_index("method").loc["unipelt_ap"]
    assert (row["mcnemar_only_method"], row["mcnemar_only_reference"], row["mcnemar_test"]) == (37, 26, "chi2")
    assert row["mcnemar_p_value"] == pytest.approx(stats.chi2.sf(121 / 63, df=1), rel=1e-5)  # the CSV keeps 6 digits
    text = (out / "paired.md").read_text()
    assert "| 37 / 26, 0.166 (χ²) " in text and "McNemar, stratified by seed" in text and "mid-p" in text


def test_the_render_writes_paired_md_with_the_floor_and_a_baseline(tmp_path):
    write_runs(tmp_path / "runs")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = (out / "paired.md").read_text()
    assert "0.0625 with 5 seeds" in text and "(0.0625)" in text
    assert "accuracy, McNemar stratified by seed: b / c, p (test)" in text and "(χ²)" in text
    assert "Cochran" not in text and "CMH" not in text and "Acc, +" in text
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--baseline", "adapter"]) == 0
    csv = pd.read_csv(out / "paired.csv")
    assert set(csv["reference"]) == {"adapter"} and set(csv["method"]) == {"unipelt_ap", "lora"}
    significance = pd.read_csv(out / "significance.csv")
    assert set(significance["test"]) == {"paired"} and significance["sign_flip_floor"].eq(0.0625).all()
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--baseline", "bogus"]) == 2


def mcc_by_numpy(labels, predicted):
    """MCC as the correlation of the two 0/1 vectors (0 when either is constant)."""
    if np.ptp(labels) == 0 or np.ptp(predicted) == 0:
        return 0.0
    return 100 * np.corrcoef(labels, predicted)[0, 1]


def test_the_bootstrap_resamples_examples_on_the_tasks_metric_mcc_recomputed_with_numpy():
    ours = [predictions(seed, 0.75) for seed in SEEDS[:3]]
    theirs = [predictions(seed, 0.7) for seed in SEEDS[:3]]
    pairs = [(l, p, q) for (l, p), (_, q) in zip(ours, theirs)]
    result = paired_bootstrap("mcc", pairs, replicates=300, seed=5)
    observed = np.mean([mcc_by_numpy(l, p) - mcc_by_numpy(l, q) for l, p, q in pairs])
    # same labels in every seed: one draw of examples per replicate, shared by the seeds and both methods
    draws = np.random.default_rng(5).integers(0, EXAMPLES, size=(300, EXAMPLES))
    replicates = np.array([np.mean([mcc_by_numpy(l[d], p[d]) - mcc_by_numpy(l[d], q[d]) for l, p, q in pairs])
                           for d in draws])
    assert result["difference"] == pytest.approx(observed)
    assert (result["ci_low"], result["ci_high"]) == pytest.approx(tuple(np.quantile(replicates, [0.025, 0.975])))
    two_sided = min(1.0, 2 * min(np.mean(replicates <= 0), np.mean(replicates >= 0)))
    assert result["p_value"] == pytest.approx(two_sided) and 0 < two_sided < 1
    # accuracy would say otherwise: the test is on MCC, not on the count of right answers
    assert result["difference"] != pytest.approx(np.mean([100 * (np.mean(p == l) - np.mean(q == l)) for l, p, q in pairs]))


def test_seeds_with_different_examples_draw_their_own():
    first = (np.array([0, 1] * 30), np.array([0, 1] * 30), np.array([1, 1] * 30))
    second = (np.array([1, 1, 0] * 10), np.array([1, 0, 0] * 10), np.array([1, 1, 0] * 10))
    result = paired_bootstrap("accuracy", [first, second], replicates=100, seed=3)
    rng = np.random.default_rng(3)
    draws = [rng.integers(0, 60, size=(100, 60)), rng.integers(0, 30, size=(100, 30))]
    replicates = np.mean([100 * (np.mean(l[d] == p[d], axis=1) - np.mean(l[d] == q[d], axis=1))
                          for (l, p, q), d in zip((first, second), draws)], axis=0)
    assert (result["ci_low"], result["ci_high"]) == pytest.approx(tuple(np.quantile(replicates, [0.025, 0.975])))


def test_a_bootstrap_p_of_zero_reads_below_two_over_b():
    """Issue 32 item 6: p = min(1, 2 x the smaller share), so the smallest p above 0 is 2/B (one replicate across 0),
    and a p of 0 is below that, not below 1/B."""
    labels = np.array([1, 0] * 50)
    right, wrong = labels.copy(), labels.copy()
    wrong[:3] = 1 - wrong[:3]  # 3 of 100 wrong: the method is never worse, rarely equal
    values = [paired_bootstrap("accuracy", [(labels, right, wrong)], replicates=b, seed=s)["p_value"]
              for b in (20, 40) for s in range(40)]
    assert min(value for value in values if value > 0) >= 2 / 40  # nothing between 0 and 2/B
    assert bootstrap_p(0.0, 2000) == "< 0.001" and bootstrap_p(0.0, 10000) == "< 0.0002"
    assert bootstrap_p(0.0123, 2000) == "0.0123"


def test_cola_tests_mcc_by_bootstrap_and_runs_no_accuracy_count(tmp_path):
    write_runs(tmp_path / "runs", skills=(("unipelt_ap", 0.95), ("lora", 0.6)), name="cola", metric="mcc")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = (out / "paired.md").read_text()
    csv = pd.read_csv(out / "paired.csv").set_index("method")
    assert csv.loc["unipelt_ap", "bootstrap_metric"] == "mcc"
    assert csv.loc["unipelt_ap", "bootstrap_p_value"] == 0  # 0.95 against 0.6: no replicate crosses 0
    header = text[:text.index("\n| K")]  # the assumptions are written above the table
    assert "**Over examples**" in header and "exchangeable" in header and "the p is optimistic" in header
    assert "MCC, +" in text and ", < 0.001" in text
    assert "McNemar stratified" not in text.split("\n| K")[1]  # no accuracy count on an MCC task
    assert "mcnemar_p_value" not in csv


def test_correlation_replicates_are_scipys_spearman_and_pearson():
    rng = np.random.default_rng(2)
    labels = np.round(rng.uniform(0, 5, 80), 1)  # ties, as STS-B's scores have
    predicted = labels + rng.normal(0, 1, 80)
    draws = rng.integers(0, 80, size=(20, 80))
    for metric, function in (("spearman", stats.spearmanr), ("pearson", stats.pearsonr)):
        expected = [100 * function(predicted[d], labels[d])[0] for d in draws]
        assert replicate_scores(metric, labels, predicted, draws) == pytest.approx(expected)
