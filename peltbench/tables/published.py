"""Published GLUE tables beyond UniPELT (results/paper/published/*.csv, as printed) beside ours: published_<name>.md.

A published table stands beside a render that pools its model (`TABLES`). Each CSV's `metric` row names the metric
the paper prints in each task's column (its caption's: e.g. MRPC accuracy, STS-B Pearson, QQP accuracy), and each
number is kept as printed, so its decimals are the paper's. Ours per cell: the reported statistic (mean, or median
where the protocol reports medians) over the data seeds of each method's compared runs (default settings, or the
setting `--select` chose) with the table's K (`K`: all, or LM-BFF's 16 per class), on that same metric (`test_<metric>`
of the records), printed with the same number of decimals as the paper's number beside it; where the paper prints
`mean (std)`, ours too, the std as that paper computes it (`STD_DDOF`). Compare a row only under the protocol the
table used (`TABLES`): the caption names both, and warns when they differ.

A table whose rows are one method under several objectives (LM-BFF's fine-tuning, prompt-based fine-tuning, with
demonstrations) has a `variant` column: the objective parts of the rows' runs' protocol label (`objective=cloze`; ""
the classifier's), and a `row` column, the paper's name of the row. A render pools one label, so ours stands beside
the row of its variant; the other rows show the paper's numbers alone (their runs are other renders:
`peltbench-tables --protocol ...`). Any other part of the label (`train.max_steps=100`) departs from the table's
protocol, and the caption warns.
"""
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import UserError
from .formatting import MISSING
from .markdown import frame_markdown
from .names import method_label, task_label
from .comparability import label_protocol, normalize_model, parse_protocol, protocol_label_order

# The C3A paper's protocol, which is none of peltbench's: its caption therefore always warns (the CSV's header says more)
C3A_PROTOCOL = "the C3A paper's own (a validation split selects, a test split reports; mean of unstated seeds)"
ROBERTA_BASE = ("roberta-base", "FacebookAI/roberta-base")
# file stem -> (the model it is of, its ids, the protocol it used); a model may have several. RoAd's and DeLoRA's
# tables split GLUE dev as ReFT/RED do (full_halves; each CSV's header says where they depart from it)
TABLES = {
    "roberta_base_glue": ("roberta-base", ROBERTA_BASE, "full_median"),
    "roberta_base_glue_c3a": ("roberta-base", ROBERTA_BASE, C3A_PROTOCOL),
    "roberta_base_glue_road": ("roberta-base", ROBERTA_BASE, "full_halves"),
    "roberta_base_glue_delora": ("roberta-base", ROBERTA_BASE, "full_halves"),
    "roberta_large_glue_road": ("roberta-large", ("roberta-large", "FacebookAI/roberta-large"), "full_halves"),
    "deberta_v3_base_glue": ("microsoft/deberta-v3-base", ("microsoft/deberta-v3-base",), "full_mean"),
    "roberta_large_lmbff": ("roberta-large", ("roberta-large", "FacebookAI/roberta-large"), "lmbff"),
}
# The K of the runs a table compares (all: the whole train split), where it is not all
K = {"roberta_large_lmbff": "16"}
# The std's delta degrees of freedom of a table that prints `mean (std)`: LM-BFF's tools/gather_result.py `np.std`
STD_DDOF = {"roberta_large_lmbff": 0}
MEAN_STD = re.compile(r"^\s*(-?[\d.]+)\s*\(\s*([\d.]+)\s*\)\s*$")  # `92.7 (0.9)`: LM-BFF's mean (std)
# as printed (or typed) -> config name; road_all: the RoAd paper's RoAd1 on every Linear, conf/method/road.yaml
ROW_NAMES = {"lora_r8": "lora", "oft_b16": "oft", "boft_m2_b8": "boft", "hra_r8": "hra", "road_all": "road"}
AVERAGES = ("avg", "all")  # the papers' average column
# columns that are no task: the trainable parameters as a count, or as the percentage of the model a paper prints
NOT_TASKS = ("method", "variant", "row", "params", "params_percent", *AVERAGES)
LABEL_KEYS = ("protocol", "precision")  # what of a render's label is neither its variant nor a departure
OBJECTIVE = "objective"  # a label's objective parts (objectives.departures) choose a variant table's row
METRIC_ROW = "metric"      # the CSV row naming each column's metric (a record's test_<metric>)
METRIC_WORDS = {"accuracy": "Acc.", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}


def load_published(paper_dir):
    """{stem: DataFrame (method, params or params_percent, one column per task, avg)} for every published table
    found, numbers as floats; `frame.attrs["metrics"]`: {task: metric}, `frame.attrs["printed"]`: {(method, task): the
    text as printed}."""
    folder = Path(paper_dir) / "published"
    tables = {}
    for stem in TABLES:
        path = folder / f"{stem}.csv"
        if path.is_file():
            tables[stem] = _read(path)
    return tables


def _read(path):
    text = pd.read_csv(path, comment="#", dtype=str, keep_default_na=False)
    tasks = [column for column in text.columns if column not in NOT_TASKS]
    metric_rows = text[text["method"] == METRIC_ROW]
    if len(metric_rows) != 1 or any(not metric_rows.iloc[0][task] for task in tasks):
        raise UserError(f"{path}: needs one `{METRIC_ROW}` row naming the metric each task's column prints "
                        f"({', '.join(METRIC_WORDS)})")
    metrics = {task: metric_rows.iloc[0][task].strip() for task in tasks}
    rows = text[text["method"] != METRIC_ROW].reset_index(drop=True)
    rows["method"] = rows["method"].map(lambda name: ROW_NAMES.get(name, name))
    frame = rows.copy()
    for column in frame.columns.drop([name for name in ("method", "variant", "row") if name in frame.columns]):
        frame[column] = pd.to_numeric(frame[column].map(_number), errors="coerce")
    frame.attrs["metrics"] = metrics
    printed = [*tasks, *(column for column in AVERAGES if column in rows.columns)]
    named = "row" in rows.columns  # a method may have several rows (one per variant): each row's own key
    frame.attrs["printed"] = {((index, method) if named else method, column): rows.at[index, column].strip()
                              for index, method in rows["method"].items() for column in printed}
    return frame


def _number(text):
    """The number a cell prints: itself, or the mean of `mean (std)`; NaN for an empty cell."""
    found = MEAN_STD.match(text)
    return found.group(1) if found else (text.strip() or np.nan)


def variant_of(label):
    """A render's variant: its protocol label's objective parts (`objective=cloze`, in their order); "" for the
    classifier's runs."""
    return ",".join(f"{key}={value}" for key, value in parse_protocol(label).items() if key.startswith(OBJECTIVE))


def other_departures(label):
    """What else a render's label has beside its protocol, precision and objective: settings off the protocol's own
    (`train.max_steps=100`), which a published table's runs did not have."""
    return ",".join(f"{key}={value}" for key, value in parse_protocol(label).items()
                    if key not in LABEL_KEYS and not key.startswith(OBJECTIVE))


def _variant(text):
    """A CSV's variant as a label's parts would spell it (canonical values, `protocol_label`'s order); a word (LM-BFF's
    `zero-shot`, no run of peltbench's) stays itself, which no render's variant is."""
    if "=" not in text:
        return text.strip()
    return variant_of(protocol_label_order(f"{text},precision=fp32"))


def matching_table(published, model):
    """The stem of the (first) published table of `model` (a render's pooled model), or None."""
    return next(iter(matching_tables(published, model)), None)


def matching_tables(published, model):
    """The stems of every published table of `model`, in TABLES' order."""
    return [stem for stem, (_, ids, _) in TABLES.items()
            if stem in published and normalize_model(model) in {normalize_model(name) for name in ids}]


def ours(runs, metrics, statistic="mean", k="all", ddof=1):
    """{(method, task): (value, seeds, std)} of runs with K = `k`, on the metric the table prints for each task (std
    with `ddof`; NaN for one seed)."""
    full = runs[(runs["k"] == k) & (runs["status"] == "ok")]
    cells = {}
    for (method, task), rows in full.groupby(["method", "task"]):
        if task not in metrics:
            continue
        column = f"test_{metrics[task]}"
        values = pd.to_numeric(rows[column], errors="coerce").dropna() if column in rows else pd.Series(dtype=float)
        if len(values):
            value = float(np.median(values) if statistic == "median" else values.mean())
            std = float(np.std(values, ddof=ddof)) if len(values) > ddof else np.nan
            cells[method, task] = (value, len(values), std)
    return cells


def decimals(printed):
    """How many decimals a number has as printed: 1 for `78.4`, 2 for `92.40`, 0 for `92`."""
    return len(printed.partition(".")[2]) if printed else 2


def published_markdown(table, cells, stem, caption, variant=""):
    """The table beside ours: `cells` ((method, task) -> ours) stand in the rows of `variant` (a table with a
    `variant` column; every row of one without), and methods the table lacks get rows of ours alone."""
    tasks = list(table.attrs["metrics"])
    printed = table.attrs["printed"]
    average = next((column for column in AVERAGES if column in table.columns), None)
    variants = table["variant"].map(_variant) if "variant" in table.columns else pd.Series("", index=table.index)
    names = table["row"] if "row" in table.columns else pd.Series("", index=table.index)
    keys = [(method, variants[i] == variant, names[i]) for i, method in table["method"].items()]
    ours_methods = {method for method, mine, _ in keys if mine}
    keys += [(method, True, "") for method in sorted({m for m, _ in cells} - ours_methods - set(table["method"]))]
    rows = []
    for index, (method, mine, name) in enumerate(keys):
        shown = cells if mine else {}
        key = (index, method) if "row" in table.columns else method  # a row's printed numbers
        shown_variant = table["variant"][index] if "variant" in table.columns and index in table.index else variant
        row = [_row_label(method, name, shown_variant),
               *(_cell(shown.get((method, task)), printed.get((key, task)), task, printed) for task in tasks)]
        if average:
            row.append(_average_cell(method, shown, tasks, table, average, key))
        rows.append(row)
    header = ["Method", *(f"{task_label(task)} ({METRIC_WORDS.get(table.attrs['metrics'][task], table.attrs['metrics'][task])})"
                          for task in tasks), *(["Avg."] if average else [])]
    return "\n".join([f"# {stem}: ours beside the published numbers", "", caption, "",
                      "Each cell: ours (n = seeds), the published number in brackets, both on the metric its column "
                      "names and with the paper's decimals. Avg.: the mean over the table's tasks (ours only with every "
                      "task), beside the paper's average column.", "",
                      frame_markdown(pd.DataFrame(rows, columns=header)), ""])


def _row_label(method, name, variant):
    """A row's name: the method's, or the paper's name of the row with the method and variant it is (`Prompt-based FT
    (man): Fine-tuning, objective=cloze`)."""
    if not name:
        return method_label(method)
    return f"{name}: {method_label(method)}" + (f", {variant}" if variant else "")


def _cell(ours_cell, theirs, task, printed):
    """`74.0 (n = 3) [78.4]`: ours rounded as the paper prints that number (its column's decimals where the paper
    has no number in the row); `92.1 (1.3) (n = 5) [92.7 (0.9)]` where the paper prints a mean (std)."""
    places = decimals(_mean_text(theirs)) if theirs else max(
        (decimals(_mean_text(text)) for (_, column), text in printed.items() if column == task and text), default=2)
    mine = MISSING
    if ours_cell is not None:
        std = ours_cell[2] if len(ours_cell) > 2 else np.nan
        spread = f" ({_rounded(std, places)})" if _prints_std(theirs, task, printed) and not np.isnan(std) else ""
        mine = f"{_rounded(ours_cell[0], places)}{spread} (n = {ours_cell[1]})"
    return f"{mine} [{theirs or MISSING}]"


def _mean_text(text):
    found = MEAN_STD.match(text or "")
    return found.group(1) if found else text


def _prints_std(theirs, task, printed):
    """Whether the paper prints this cell (or, where it has none, its column) as `mean (std)`."""
    if theirs:
        return bool(MEAN_STD.match(theirs))
    return any(MEAN_STD.match(text) for (_, column), text in printed.items() if column == task and text)


def _average_cell(method, cells, tasks, table, column, key=None):
    """The papers' average column beside ours: the mean of our cells over the table's tasks (only when we have every
    one), with the decimals the paper prints it with."""
    text = table.attrs["printed"].get((method if key is None else key, column)) or MISSING
    places = decimals(text) if text != MISSING else max(
        (decimals(printed) for (_, name), printed in table.attrs["printed"].items() if name == column and printed), default=2)
    ours_cells = [cells.get((method, task)) for task in tasks]
    mine = (MISSING if any(cell is None for cell in ours_cells)
            else _rounded(float(np.mean([cell[0] for cell in ours_cells])), places))
    return f"{mine} [{text}]"


def _rounded(value, places):
    text = f"{value:.{places}f}"
    return text.replace("-", "", 1) if float(text) == 0 else text  # never -0.0


def write_published(out, runs, render, paper_dir, statistic="mean"):
    """published_<stem>.md for each published table of the model the render pools; returns index entries."""
    published = load_published(paper_dir)
    entries = []
    for stem in matching_tables(published, render.selection.model):
        entries += _write_one(out, runs, render, published[stem], stem, statistic)
    return entries


def _write_one(out, runs, render, table, stem, statistic):
    metrics = table.attrs["metrics"]
    places = sorted({decimals(_mean_text(text)) for text in table.attrs["printed"].values() if text})
    what = "median" if statistic == "median" else "mean"
    protocol = TABLES[stem][2]
    k, ddof = K.get(stem, "all"), STD_DDOF.get(stem, 1)
    pooled = label_protocol(render.selection.protocol)
    variant = variant_of(render.selection.protocol)
    warning = ("" if pooled == protocol else f"**Warning: these runs are of protocol {pooled}, the published table's "
               f"is {protocol}: not like with like.** ")
    departs = other_departures(render.selection.protocol) if "variant" in table.columns else ""
    if departs:
        warning += f"**Warning: these runs depart from protocol {protocol} ({departs}): not like with like.** "
    spread = (f" (and the standard deviation, ddof {ddof}, as the paper's)" if any(
        MEAN_STD.match(text) for text in table.attrs["printed"].values()) else "")
    rows = (f" Ours stand in the rows of this render's variant ({variant or 'the classifier'}); the other rows show "
            f"the paper alone." if "variant" in table.columns else "")
    caption = (warning + f"Published: results/paper/published/{stem}.csv (its header names the source), protocol "
               f"{protocol}; each column's metric as the paper's caption or header states it (the CSV's metric row: "
               f"{_metric_list(metrics)}), numbers with the paper's {' or '.join(map(str, places))} decimal(s). Ours: "
               f"the {what}{spread} over data seeds of K = {k} runs on the same metric, rounded as the paper's number "
               f"beside it.{rows} " + (f"{render.selected} " if render.selected else "") + render.selection.caption())
    cells = ours(runs, metrics, statistic, k, ddof)
    out.text(f"published_{stem}.md", published_markdown(table, cells, stem, caption, variant))
    return [(f"published_{stem}.md", f"ours beside the published {stem} table (K = {k}, {what} over seeds, on each "
                                     "column's published metric)")]


def _metric_list(metrics):
    words = ", ".join(f"{task_label(task)} {METRIC_WORDS.get(metric, metric)}" for task, metric in metrics.items())
    return words + ("; MNLI matched" if "mnli" in metrics else "")
