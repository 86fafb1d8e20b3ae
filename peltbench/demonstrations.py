"""Demonstrations: LM-BFF's `prompt-demo` (Gao, Fisch, Chen, ACL 2021, §5), as its released code builds them
(princeton-nlp/LM-BFF at c282f521001f9c299d29eec7b459266f2b14fbaf: `run.py` for the template, `src/dataset.py`
`FewShotDataset` for the sampling and the filter). docs/protocol.md §12.3.

One training row of each class is appended to every input, in the task's class order, each written with the
template's own words and its class's label word where the query has the mask. For SST-2:

    *cls**sent_0*_It_was*mask*.*sep+*                                                     (the prompt)
    *cls**sent_0*_It_was*mask*.*sep+**sent_1*_It_was*label_0*.*sep+**sent_2*_It_was*label_1*.*sep+*   (demonstrations)

sentence 1 being the class-0 demonstration and sentence 2 the class-1 one (a sentence pair: sentences 2-3, 4-5, ...).

How a demonstration is chosen (`select`, LM-BFF's `select_context`): the candidate rows in a random order, and the
first row of each class in it. The candidates are the run's training rows, without the row itself when training
(LM-BFF excludes the query's index in train mode); with the filter (`filtered`, LM-BFF's `--demo_filter`) only the
`rate` share most similar to the query of each class, by the cosine of sentence embeddings.

Where the random order comes from:
- evaluation: LM-BFF builds its dev and test inputs right after `set_seed(seed)` (numpy's global stream), dev first,
  then test, each as `num_sample` passes over its rows, one `np.random.permutation(len(candidates))` per input.
  `evaluation_sets` draws exactly that stream from `np.random.RandomState(seed)`, seed the run's model seed (under
  protocol=lmbff its data seed, LM-BFF's one `--seed`): for the same seed, rows and candidates, the same
  demonstrations (tests/test_demonstrations.py: fixtures computed by running LM-BFF's code). A prediction is the
  mean of its `num_sample` inputs' logits (LM-BFF's `compute_metrics_fn`).
- training: LM-BFF draws from the same global stream each time its sampler hands it a row, in its own data order,
  which peltbench's does not reproduce (each member's own generator: train.py). Here each training input's order is
  drawn from a generator keyed by the run's model seed, its data seed, the step and the row (`training_order`), as
  its dropout masks are (methods/randomness.py): a different set of demonstrations each time a row is seen, the same
  in any fused group, after any resume, on any device.

A regression task (STS-B) is classed as LM-BFF does for this: `score <= median` (LM-BFF's `median_mapping`, 2.5) is
class 0, above it class 1; both are sampled, but LM-BFF's template conversion loops over `num_labels`, which is 1 for
STS-B, so its template appends only the class-0 demonstration (`*sent_2*` ... `*label_0*`): so does this one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import UserError
from .data import Encoded
from .progress import progress
from .sentence_encoder import row_text, sentence_embeddings, sentence_pooling

# LM-BFF's class order (its processors' get_labels), where it differs from the task's class ids: the order of the
# demonstrations in the input and the i of `*label_i*` there. The other GLUE tasks' lists equal their ids' order
# (cola, sst2, mrpc, qqp: '0', '1'; qnli, rte: entailment, not_entailment).
LMBFF_CLASS_ORDER = {"mnli": ("contradiction", "entailment", "neutral")}
TRAINING_SALT = 0x44454D4F  # "DEMO": keeps these draws apart from any other generator keyed by the same seeds


# ---------------------------------------------------------------- the template

def demonstration_template(template: str, classes: Sequence[int], sentences: int) -> str:
    """The template with one demonstration part per class appended (run.py, "Automatically convert the template to
    using demonstrations"): the template without `*cls*`, its sentences renumbered to the demonstration's
    (`sentences` per row: sentence s of the i-th demonstration is `sentences * (i + 1) + s`), its `*mask*` replaced by
    that class's label word (`*label_c*`, c the class id of `classes[i]`).

    LM-BFF renumbers with a textual `replace("_{s}", ...)` over the whole part; here only the sentence variables are
    renumbered. The two agree on every template whose text holds no `_0` or `_1` and with fewer than 5 classes of
    sentence pairs (LM-BFF's replace would then renumber the `_10` it just wrote again): the 8 GLUE templates
    (tests/test_demonstrations.py)."""
    body = template.replace("*cls*", "").split("*")
    pieces = [template]
    for position, label in enumerate(classes):
        renamed = [_renumber(part, sentences * (position + 1)) for part in body]
        pieces.append("*".join(f"label_{label}" if part == "mask" else part for part in renamed))
    return "".join(pieces)


def _renumber(part: str, offset: int) -> str:
    """A sentence variable (`sent_0`, `+sentl_1`, ...: LM-BFF's own test, `part[:4] == 'sent' or part[1:5] ==
    'sent'`) moved by `offset`; any other part as it is."""
    if part[:4] == "sent" or part[1:5] == "sent":
        head, _, index = part.partition("_")
        return f"{head}_{int(index) + offset}"
    return part


# ---------------------------------------------------------------- classes

def class_order(task) -> tuple[int, ...]:
    """The classes in the order their demonstrations follow each other (LM-BFF's label list, as class ids); a
    regression task: its two classes, low then high (`demonstration_classes`)."""
    if task.is_regression:
        return (0, 1)
    names = LMBFF_CLASS_ORDER.get(task.name)
    if names is None or tuple(sorted(names)) != tuple(sorted(task.label_names or ())):
        return tuple(range(task.num_labels))
    return tuple(task.label_names.index(name) for name in names)


def template_classes(task) -> tuple[int, ...]:
    """The classes whose demonstrations the template shows: all of them; a regression task only class 0, as LM-BFF's
    template conversion (its `num_labels` is 1 for STS-B: module docstring)."""
    return (0,) if task.is_regression else class_order(task)


def median(task) -> float:
    """The score that splits a regression task's rows into two demonstration classes (LM-BFF's `median_mapping`,
    STS-B 2.5): the task's `lmbff_threshold`, else the middle of its `label_range`."""
    if task.lmbff_threshold is not None:
        return float(task.lmbff_threshold)
    if task.label_range is not None:
        return (task.label_range[0] + task.label_range[1]) / 2
    raise UserError(f"task={task.name}: demonstrations of a regression task class its rows as low or high; the task "
                    f"names neither lmbff_threshold nor label_range to split them at")


def demonstration_classes(labels: np.ndarray, task) -> np.ndarray:
    """Each row's class for sampling: its label, or a regression score's `0 if score <= median else 1` (LM-BFF's
    `select_context`; note `<=`, where its split script classes at `< 2.5`)."""
    if task.is_regression:
        return (np.asarray(labels, dtype=np.float64) > median(task)).astype(np.int64)
    return np.asarray(labels, dtype=np.int64)


def check_support(classes: np.ndarray, order: Sequence[int], task_name: str) -> None:
    """Every class needs two training rows: one to be the query and one to be its demonstration (training leaves
    the query out of its own candidates)."""
    counts = {label: int((classes == label).sum()) for label in order}
    short = [label for label, count in counts.items() if count < 2]
    if short:
        raise UserError(f"task={task_name}: demonstrations need at least 2 training rows of each class (a row is "
                        f"never its own demonstration), and class {short[0]} has {counts[short[0]]}")


# ---------------------------------------------------------------- candidates and the filter

def candidates(size: int, query: int | None) -> list[int]:
    """The training rows that may be a demonstration: all `size` of them, without `query` (a training row's own
    index; None at evaluation)."""
    return [row for row in range(size) if row != query]


def filtered(similarity: np.ndarray, classes: np.ndarray, order: Sequence[int], rate: float,
             query: int | None) -> list[int]:
    """LM-BFF's demonstration filter: the candidates by decreasing similarity to the query (a stable sort, as its
    `sim_score.sort(reverse=True)`), keeping of each class the first `int(n // classes * rate)`, n the number of
    candidates. `similarity[row]`: the query's cosine with each training row."""
    rows = candidates(len(classes), query)
    ranked = sorted(rows, key=lambda row: similarity[row], reverse=True)
    limit = int(len(rows) // len(order) * rate)
    kept, counts = [], dict.fromkeys(order, 0)
    for row in ranked:
        label = int(classes[row])
        if counts[label] < limit:
            counts[label] += 1
            kept.append(row)
    return kept


def check_rate(rate: float, size: int, order: Sequence[int]) -> None:
    """A filter that keeps no candidate of a class is refused (LM-BFF would stop at `assert len(selection) > 0` or
    build an input without that class)."""
    if int((size - 1) // len(order) * rate) < 1:
        raise UserError(f"objective.demo_filter_rate={rate}: with {size} training rows in {len(order)} classes it "
                        f"keeps no candidate of a class (LM-BFF keeps int(n // classes * rate) of each); raise it")


def cosine(queries: np.ndarray, support: np.ndarray) -> np.ndarray:
    """(queries, support) cosine similarities, as sentence-transformers' `cos_sim` computes them (float32 rows
    normalised to unit length, then their products)."""
    import torch
    import torch.nn.functional as F

    a = F.normalize(torch.as_tensor(np.asarray(queries, dtype=np.float32)), p=2, dim=1)
    b = F.normalize(torch.as_tensor(np.asarray(support, dtype=np.float32)), p=2, dim=1)
    return (a @ b.T).numpy()


# ---------------------------------------------------------------- choosing

def select(order: np.ndarray, pool: Sequence[int], classes: np.ndarray, wanted: Sequence[int]) -> list[int]:
    """LM-BFF's `select_context` with one demonstration per class: go through `pool` in the random `order` (a
    permutation of its positions) and take the first row of each class; the rows in the order of `wanted`."""
    chosen: dict[int, int] = {}
    for position in order:
        row = pool[int(position)]
        label = int(classes[row])
        if label not in chosen:
            chosen[label] = row
            if len(chosen) == len(wanted):
                break
    missing = [label for label in wanted if label not in chosen]
    if missing:  # check_support and check_rate refuse this when a run's sets are built, before it trains
        raise UserError(f"no demonstration of class {missing[0]} among {len(pool)} candidates")
    return [chosen[label] for label in wanted]


def evaluation_sets(seed: int, pools: Sequence[Sequence[Sequence[int]]], classes: np.ndarray,
                    wanted: Sequence[int], num_sample: int) -> list[np.ndarray]:
    """The demonstrations of each evaluation split (dev, then test): for split s an array (num_sample, its rows,
    classes) of training-row indices, `pools[s][q]` being query q's candidates. Drawn as LM-BFF builds its dev and then
    its test set right after `set_seed(seed)`: one `permutation(len(pool))` of numpy's legacy stream per input, the
    inputs sample after sample (module docstring)."""
    stream = np.random.RandomState(seed)
    sets = []
    for split in pools:
        chosen = np.empty((num_sample, len(split), len(wanted)), dtype=np.int64)
        for sample in range(num_sample):
            for query, pool in enumerate(split):
                chosen[sample, query] = select(stream.permutation(len(pool)), pool, classes, wanted)
        sets.append(chosen)
    return sets


def training_order(model_seed: int, data_seed: int, step: int, row: int, size: int) -> np.ndarray:
    """The random order of a training input's `size` candidates: a generator keyed by the run's seeds, the step and
    the row (module docstring), so the same wherever and whenever the step runs."""
    key = [TRAINING_SALT, model_seed & 0xFFFFFFFF, data_seed & 0xFFFFFFFF, step, row]
    return np.random.default_rng(key).permutation(size)


def training_demonstrations(model_seed: int, data_seed: int, step: int, rows: Sequence[int],
                            pools: Sequence[Sequence[int]], classes: np.ndarray,
                            wanted: Sequence[int]) -> list[list[int]]:
    """The demonstrations of a step's training rows (indices into the training rows; `pools[row]` its candidates)."""
    return [select(training_order(model_seed, data_seed, step, row, len(pools[row])), pools[row], classes, wanted)
            for row in rows]


# ---------------------------------------------------------------- the inputs

def demonstration_input(query: Sequence[str], shown: Sequence[Sequence[str]], template: str, tokenizer,
                        label_word_list: Sequence[int], max_length: int, first_sent_limit: int | None = None,
                        other_sent_limit: int | None = None, double_demo: bool = False, truncate_head: bool = False):
    """One input with its demonstrations (LM-BFF's `convert_fn`, use_demo): the query's sentences, then each
    demonstration's in class order (`shown`: their sentences), tokenised by the demonstration template; `double_demo`
    doubles the length (run_experiment.sh's `--double_demo`: the length is then one sentence's). A
    `templates.Tokenized` (its `mask_pos` None where the cut removed the mask)."""
    from .templates import tokenize_multipart_input

    texts = [*query, *(sentence for row in shown for sentence in row)]
    return tokenize_multipart_input(texts, max_length * 2 if double_demo else max_length, tokenizer, template,
                                    label_word_list, first_sent_limit, other_sent_limit, truncate_head)


# ---------------------------------------------------------------- a run's sets

@dataclass(frozen=True)
class DemoSetting:
    """What a run's demonstrations are (its objective's settings, the task's length rules: run_experiment.sh)."""

    num_sample: int                     # evaluation: demonstration sets per row, their outputs averaged
    max_length: int                     # tokens of an input (doubled with double_demo)
    first_sent_limit: int | None = None
    other_sent_limit: int | None = None
    double_demo: bool = False
    truncate_head: bool = False         # LM-BFF's --truncate_head (objective.truncate_head)
    filter: str | None = None           # the sentence encoder's folder (LM-BFF's --demo_filter), or None
    filter_rate: float = 0.5            # LM-BFF's --demo_filter_rate


@dataclass(frozen=True)
class DemoPrompt:
    """The query's template, the demonstration template, the label words' ids and the tokenizer (cached encode)."""

    template: str
    tokenizer: object
    label_word_list: tuple[int, ...]

    def build(self, query, shown, setting: DemoSetting, where: str) -> list[int]:
        built = demonstration_input(query, shown, self.template, self.tokenizer, self.label_word_list,
                                    setting.max_length, setting.first_sent_limit, setting.other_sent_limit,
                                    setting.double_demo, setting.truncate_head)
        if built.mask_pos is None:
            length = setting.max_length * (2 if setting.double_demo else 1)
            raise UserError(f"{where}: the input with its demonstrations is cut at {length} tokens without its *mask* "
                            f"(raise train.max_length, or set objective.first_sent_limit)")
        return built.input_ids


class DemonstrationTrain(Encoded):
    """A run's training rows, whose inputs are built anew at every step (`draw`, called by the training loop before
    the step) with demonstrations drawn for that step and row (`training_order`)."""

    def __init__(self, rows: list[list[str]], labels: np.ndarray, pools: list[list[int]], classes: np.ndarray,
                 wanted: tuple[int, ...], prompt: DemoPrompt, setting: DemoSetting, model_seed: int,
                 data_seed: int) -> None:
        super().__init__([[] for _ in rows], [[] for _ in rows], labels)
        self.rows, self.pools, self.classes, self.wanted = rows, pools, classes, wanted
        self.prompt, self.setting, self.seeds = prompt, setting, (model_seed, data_seed)
        self.draw(0, list(range(len(rows))))  # inputs of their length before training (the runner's memory plan)

    def draw(self, step: int, rows: list[int]) -> None:
        chosen = training_demonstrations(*self.seeds, step, rows, self.pools, self.classes, self.wanted)
        for row, shown in zip(rows, chosen):
            ids = self.prompt.build(self.rows[row], [self.rows[r] for r in shown], self.setting,
                                    f"training row {row}")
            self.input_ids[row], self.token_type_ids[row] = ids, [0] * len(ids)


def evaluation_encoded(queries: list[list[str]], labels: np.ndarray, chosen: np.ndarray, support: list[list[str]],
                       prompt: DemoPrompt, setting: DemoSetting, split: str) -> Encoded:
    """An evaluation split's inputs: each row once per demonstration set (`chosen`: (samples, rows, classes) training
    rows), sample after sample, their labels repeated (data.Encoded.samples)."""
    samples, count, _ = chosen.shape
    input_ids = []
    bar = progress(total=samples * count, desc=f"demonstrations {split}", unit="row")
    for sample in range(samples):
        for row in range(count):
            shown = [support[r] for r in chosen[sample, row]]
            input_ids.append(prompt.build(queries[row], shown, setting, f"{split} row {row}"))
            bar.update(1)
    bar.close()
    return Encoded(input_ids, [[0] * len(ids) for ids in input_ids], np.tile(labels, samples), samples)


def demonstration_sets(task, train: tuple[list[list[str]], np.ndarray],
                       evaluation: list[tuple[list[list[str]], np.ndarray]],
                       template: str, tokenizer, label_word_list: Sequence[int], setting: DemoSetting, model_seed: int,
                       data_seed: int) -> tuple[DemonstrationTrain, list[Encoded]]:
    """A run's training set and its evaluation sets (dev, test) with demonstrations. `train` and each of `evaluation`:
    (rows' sentences, labels). The evaluation sets are drawn from `np.random.RandomState(model_seed)` as LM-BFF's are
    from `set_seed(seed)` (its one seed is both of ours under protocol lmbff: module docstring)."""
    support, labels = train
    classes = demonstration_classes(labels, task)
    wanted = class_order(task)
    check_support(classes, wanted, task.name)
    similarity = _similarities(setting, support, [rows for rows, _ in evaluation])
    if setting.filter is not None:
        check_rate(setting.filter_rate, len(support), wanted)

    def pool(scores, query):
        if scores is None:
            return candidates(len(support), query)
        return filtered(scores, classes, wanted, setting.filter_rate, query)

    train_pools = [pool(None if similarity is None else similarity[0][row], row) for row in range(len(support))]
    pools = [[pool(None if similarity is None else similarity[1 + s][row], None) for row in range(len(rows))]
             for s, (rows, _) in enumerate(evaluation)]
    prompt = DemoPrompt(demonstration_template(template, template_classes(task), len(task.text)),
                        CachedEncode(tokenizer), tuple(label_word_list))
    chosen = evaluation_sets(model_seed, pools, classes, wanted, setting.num_sample)
    sets = [evaluation_encoded(rows, split_labels, picks, support, prompt, setting, name)
            for (rows, split_labels), picks, name in zip(evaluation, chosen, ("dev", "test"))]
    return DemonstrationTrain(support, labels, train_pools, classes, wanted, prompt, setting, model_seed,
                              data_seed), sets


def _similarities(setting: DemoSetting, support, evaluation) -> list[np.ndarray] | None:
    """The filter's cosines of each split's rows (training, then each evaluation split) with the training rows."""
    if setting.filter is None:
        return None
    texts = [row_text(row) for row in support]
    splits = [texts, *([row_text(row) for row in rows] for rows in evaluation)]
    embedded = sentence_embeddings(setting.filter, [text for split in splits for text in split])
    out, start = [], 0
    for split in splits:
        out.append(cosine(embedded[start : start + len(split)], embedded[: len(texts)]))
        start += len(split)
    return out


class CachedEncode:
    """A tokenizer whose `encode` remembers: the demonstrations' sentences come back in input after input (LM-BFF's
    `enc(text)` is `tokenizer.encode(text, add_special_tokens=False)`, a function of its text)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.cache = tokenizer, {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        key = (text, add_special_tokens)
        if key not in self.cache:
            self.cache[key] = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return self.cache[key]

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


# ---------------------------------------------------------------- a run's settings

def wanted(cfg) -> bool:
    """Whether a run appends demonstrations (objective=cloze, objective.demonstrations=true)."""
    objective = cfg.get("objective") if hasattr(cfg, "get") else None
    return objective is not None and objective.get("name") == "cloze" and bool(objective.get("demonstrations"))


def setting_of(cfg, task) -> DemoSetting:
    """A run's demonstration setting: its objective's values, or where one is null the task file's `cloze:` value,
    else LM-BFF's default (run_experiment.sh: 16 sets; no double length)."""
    given = cfg.task.get("cloze") or {}
    objective = cfg.objective

    def value(key, default):
        chosen = objective.get(key)
        chosen = given.get(key) if chosen is None else chosen
        return default if chosen is None else chosen

    from .cloze import prompt_of

    prompt = prompt_of(cfg, task)
    return DemoSetting(num_sample=int(value("num_sample", 16)), max_length=int(cfg.train.max_length),
                   first_sent_limit=prompt.first_sent_limit, other_sent_limit=prompt.other_sent_limit,
                   double_demo=bool(value("double_demo", False)), truncate_head=prompt.truncate_head,
                   filter=None if objective.get("demo_filter") is None else str(objective.demo_filter),
                   filter_rate=float(objective.get("demo_filter_rate", 0.5)))


def check_demonstrations(cfg, task) -> None:
    """Before torch: a regression task that can be classed, a task file's values of the right kind, and a filter's
    sentence encoder that is a checkpoint folder whose pooling peltbench reads."""
    if task.is_regression:
        median(task)
    given = cfg.task.get("cloze") or {}
    count = given.get("num_sample")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise UserError(f"task.cloze.num_sample={count}: must be a positive number of demonstration sets")
    double = given.get("double_demo")
    if double is not None and not isinstance(double, bool):
        raise UserError(f"task.cloze.double_demo={double}: must be true or false")
    path = cfg.objective.get("demo_filter")
    if path is not None:
        folder = Path(os.path.expanduser(str(path)))
        if not (folder / "config.json").is_file():
            raise UserError(f"objective.demo_filter={path}: not a checkpoint folder (no config.json there); give the "
                            f"folder of a sentence encoder, e.g. all-MiniLM-L6-v2's")
        sentence_pooling(folder)


def run_sets(cfg, task, tokenizer, splits) -> tuple[DemonstrationTrain, Encoded, Encoded]:
    """A run's training, dev and test sets with demonstrations (runner.prepare_member): `splits` are (split, rows)
    of each."""
    from .cloze import prompt_label_ids, prompt_of

    prompt = prompt_of(cfg, task)
    texts = [([[texts[int(i)] for texts in split.texts] for i in rows], split.labels[rows]) for split, rows in splits]
    train, (dev, test) = demonstration_sets(task, texts[0], texts[1:], prompt.template, tokenizer,
                                            prompt_label_ids(prompt, task, tokenizer), setting_of(cfg, task),
                                            int(cfg.model_seed), int(cfg.seed))
    return train, dev, test
