"""Markdown (GitHub) renderings of Tables 1-4, "ours − paper" and the significance summary.

GitHub drops `<u>`, so the paper's underline (2nd best) is written `<ins>`; bold is `**`.
"""
import pandas as pd

from .formatting import MISSING, apart_title, blocks, center, is_missing, larger_of_pair, number, param_count, percent, seeds_note, signed, spread
from .names import AVG, EFFICIENCY_METHODS, k_label, method_label, task_label

UPPER_BOUND_HEADER = ["K", "max({A, P})", "UniPELT (AP)", "max({A, P, L})", "UniPELT (APL)"]  # Table 2's columns


def frame_markdown(frame):
    """A GitHub pipe table; cells are strings already, so tabulate must not re-parse "0.00" into 0."""
    return frame.to_markdown(index=False, disable_numparse=True)


def score_table_markdown(table, title, caption, expected, table_name, significant=frozenset()):
    """Table 1 or 3: one pipe table per K, then the legend and the runs that were left out.

    `significant` holds (k, method, task) cells to mark with `*` (see significance.md). Methods the paper's
    table does not have follow a separating row, unranked.
    """
    parts = [f"# {title}", "", caption, ""]
    header = ["Method", *(task_label(task) for task in (*table.tasks, AVG))]
    apart = False
    for k, rows in blocks(table.cells):
        lines = []
        for method, cells, paper_row in rows:
            if not paper_row and not any(line[0] == _apart_label(table_name) for line in lines):
                lines.append([_apart_label(table_name)] + [""] * (len(header) - 1))
                apart = True
            lines.append(_row(method, cells, table.tasks, expected, k, significant))
        parts += [f"## {k_label(k)}", "", frame_markdown(pd.DataFrame(lines, columns=header)), ""]
    return "\n".join([*parts, _legend(expected, significant, apart and table_name), "", *problems_markdown(table.problems)])


def _apart_label(table_name):
    return f"*{apart_title(table_name)}:*"


def _legend(expected, significant, apart_table=None):
    legend = [f"**Bold**: best, <ins>underlined</ins>: 2nd best per column and K. `{MISSING}`: no score."]
    if expected > 1:
        legend.append(f"`n=3`: fewer seeds than the {expected} expected.")
    if significant:
        legend.append("`*`: differs from the best single method, paired t-test over data seeds p < 0.05 (significance.md).")
    if apart_table:
        legend.append(f"Rows below *{apart_title(apart_table)}* are methods the paper's {apart_table} does not have: "
                      "they take no bold or underline.")
    return " ".join(legend)


def _row(method, cells, tasks, expected, k, significant):
    return [method_label(method)] + [
        score_cell(cells[task], expected, (k, method, task) in significant) for task in (*tasks, AVG)
    ]


def score_cell(cell, expected, significant=False):
    """`79.61 ± 4.25`, bold or `<ins>` by rank, ` *` if significant, ` (n=3)` if seeds are missing; `–` if none."""
    if cell.n == 0 or is_missing(center(cell)):
        return MISSING
    value = number(center(cell)) + (f" ± {number(spread(cell))}" if spread(cell) is not None else "")
    value = {1: f"**{value}**", 2: f"<ins>{value}</ins>"}.get(cell.rank, value)
    note = seeds_note(cell, expected)
    return value + (" *" if significant else "") + (f" ({note})" if note else "")


def problems_markdown(problems):
    """The runs left out of every average, counted, then listed in the paper's order."""
    if problems.empty:
        return []
    failed = int((problems["status"] != "ok").sum())
    lines = [f"Runs left out, never averaged in: {failed} failed, {len(problems) - failed} with an undefined score.", ""]
    for run in problems.itertuples():
        setup = f"{method_label(run.method)}, {task_label(run.task)}, {k_label(run.k)}, seed {run.seed}"
        lines.append(f"- {setup}: {run.reason}")
    return lines + [""]


def upper_bound_markdown(bounds, caption):
    """Table 2: K × (max({A, P}), UniPELT (AP), max({A, P, L}), UniPELT (APL)); the larger of each pair bold."""
    rows = []
    for k, row in bounds.iterrows():
        rows.append([k, *_bold_larger(row["upper_ap"], row["unipelt_ap"]), *_bold_larger(row["upper_apl"], row["unipelt_apl"])])
    return "\n".join(["# Table 2: UniPELT vs. the upper bound of its submodules", "", caption, "",
                      frame_markdown(pd.DataFrame(rows, columns=UPPER_BOUND_HEADER)), ""])


def _bold_larger(bound, unipelt):
    """The paper bolds the larger number of each pair."""
    flags = larger_of_pair(bound, unipelt)
    return [f"**{number(value)}**" if bold else number(value) for value, bold in zip((bound, unipelt), flags)]


def efficiency_markdown(table, paper, caption):
    """Table 4 with the paper's numbers beside ours (when the paper's table is at hand); methods the paper's
    Table 4 does not have follow a separating row."""
    paper = paper.set_index("method") if paper is not None else pd.DataFrame()
    rows = []
    for method, row in table.iterrows():
        ours = [f"{param_count(row['trainable_params'])} ({percent(row['params_percent'])})",
                percent(row["train_time_percent"]), percent(row["inference_time_percent"])]
        if method not in EFFICIENCY_METHODS and not any(line[0] == _apart_label("Table 4") for line in rows):
            rows.append([_apart_label("Table 4")])
        rows.append([method_label(method), *_beside(ours, paper, method), str(int(row["setups"]))])
    names = ["#Param.", "Time_T", "Time_I"]
    if not paper.empty:
        names = [f"{name}{suffix}" for name in names for suffix in ("", " (paper)")]
    header = ["Method", *names, "setups"]
    rows = [row + [""] * (len(header) - len(row)) for row in rows]
    return "\n".join(["# Table 4: trainable parameters and relative training / inference time", "", caption, "",
                      frame_markdown(pd.DataFrame(rows, columns=header)), ""])


def _beside(ours, paper, method):
    """Our three cells interleaved with the paper's (`–` for a method the paper did not time)."""
    if paper.empty:
        return ours
    if method not in paper.index:
        return [text for cell in ours for text in (cell, MISSING)]
    row = paper.loc[method]
    theirs = [f"{row['params']} ({percent(row['params_percent'])})",
              percent(row["train_time_percent"]), percent(row["inference_time_percent"])]
    return [text for pair in zip(ours, theirs) for text in pair]


def diff_markdown(diff, title, tasks, caption):
    """"Ours − paper" for Table 1 or 3: one table per K, each cell `+0.51 (79.61)`, the paper's number in parentheses.

    `caption` says which model and protocol our runs used (and warns when that is not the paper's).
    """
    parts = [f"# {title}", "", caption, "",
             f"Each cell: ours − paper, the paper's number in parentheses; `{MISSING}` where either side has no number.", ""]
    header = ["Method", *(task_label(task) for task in (*tasks, AVG))]
    for k, block in diff.groupby("k", sort=False):
        cells = block.set_index(["method", "task"])
        rows = [[method_label(method), *(_diff_cell(cells, method, task) for task in (*tasks, AVG))]
                for method in block["method"].unique()]
        parts += [f"## {k_label(k)}", "", frame_markdown(pd.DataFrame(rows, columns=header)), ""]
    return "\n".join(parts)


def _diff_cell(cells, method, task):
    if (method, task) not in cells.index:
        return MISSING
    cell = cells.loc[(method, task)]
    return MISSING if is_missing(cell["paper"]) else f"{signed(cell['difference'])} ({number(cell['paper'])})"


def diff_upper_bound_markdown(diff, caption):
    """"Ours − paper" for Table 2, same cell format as `diff_markdown`, under the same kind of caption."""
    wide = diff.assign(text=[f"{signed(d)} ({number(p)})" if not is_missing(p) else MISSING
                             for d, p in zip(diff["difference"], diff["paper"])])
    table = wide.pivot(index="k", columns="column", values="text").reindex(columns=["upper_ap", "unipelt_ap", "upper_apl", "unipelt_apl"])
    table = table.loc[list(dict.fromkeys(diff["k"]))].reset_index()
    table.columns = UPPER_BOUND_HEADER
    return "\n".join(["# Table 2: ours − paper", "", caption, "", "Each cell: ours − paper, the paper's number in parentheses.", "",
                      frame_markdown(table), ""])


def significance_markdown(results):
    """significance.md: a count per UniPELT variant, then every comparison with its p-value."""
    parts = ["# Significance: UniPELT vs. the best single method", "",
             "Per K and task, each UniPELT variant against the single method (fine-tuning, BitFit, adapter, "
             "prefix-tuning, LoRA) with the highest mean, paired over the data seeds both ran: the paired t-test "
             "(two-sided; p < 0.05 marked `*` in table1.md) and the exact sign-flip test, which over n pairs cannot go "
             "below 2/2^n (0.0625 for 5 seeds, 0.25 for 3: it can never reach 0.05 with 5 seeds or fewer, so it marks "
             "nothing). `welch`: fewer than 2 seeds shared, Welch's unpaired t-test instead. `n/a`: fewer than 2 seeds "
             "on a side, or the differences all equal.", ""]
    for method, rows in results.groupby("method", sort=False):
        tested = rows["p_value"].notna()
        better = (rows["significant"] & (rows["difference"] > 0)).sum()
        worse = (rows["significant"] & (rows["difference"] < 0)).sum()
        parts.append(f"- {method_label(method)}: significantly better in {better}, significantly worse in {worse} "
                     f"of {tested.sum()} tested setups ({(~tested).sum()} n/a).")
    table = pd.DataFrame({
        "K": results["k"], "Task": results["task"].map(task_label), "UniPELT": results["method"].map(method_label),
        "mean": results["mean"].map(number), "best single": results["best_single"].map(method_label),
        "its mean": results["best_mean"].map(number), "difference": results["difference"].map(signed),
        "test": results["test"] + results["pairs"].map(lambda n: f" (n={n})" if n else ""),
        "p": results["p_value"].map(_p),
        "sign-flip p (floor)": [MISSING if is_missing(p) else f"{_p(p)} ({_p(floor)})"
                                for p, floor in zip(results["sign_flip_p"], results["sign_flip_floor"])],
        "": results["significant"].map(lambda flag: "*" if flag else ""),
    })
    return "\n".join([*parts, "", frame_markdown(table), ""])


def _p(value):
    return "n/a" if is_missing(value) else f"{value:.3g}"
