"""selection.md / .tex / .csv: the settings chosen on dev (selection.py), one table per K, every candidate in the CSV."""
import pandas as pd

from . import latex
from .formatting import MISSING, is_missing, number
from .markdown import frame_markdown
from .names import TASKS, k_label, method_label, order_of, task_label
from .captions import selection_rows
from .selection import DEFAULT_STATISTIC, chosen_cells, describe


def write_selection(out, chosen, render, statistic=DEFAULT_STATISTIC):
    """selection.md / .tex / .csv of a selection (selection.select_settings); returns index entries."""
    out.csv("selection.csv", chosen.rows)
    caption = " ".join([describe(chosen, statistic, render.ddof), _dev_rows(chosen, render), render.selection.caption()])
    cells = chosen_cells(chosen, statistic)
    out.text("selection.md", selection_markdown(cells, chosen, caption, render.expected))
    missing = (" Notes (grids with missing seeds are compared only on the seeds all candidates share): "
               + "; ".join(chosen.notes) + "."
               if chosen.notes else "")
    out.text("selection.tex", selection_latex(cells, caption + missing, render.expected))
    for note in chosen.notes:
        render.notes.append(f"selection: {note}")
    return [("selection.md / .tex / .csv", f"{chosen.label} chosen on dev per method, task and K; the CSV lists every "
                                           "candidate with its seeds, dev mean and test mean ± std")]


def _dev_rows(chosen, render):
    """Which rows the setting was chosen on, as the protocol has them (captions.selection_rows): under full_median
    and full_mean GLUE dev, the reported set itself."""
    ks = sorted(set(chosen.rows["k"]), key=lambda k: (k == "all", k))
    rows = {selection_rows(render.selection, k, _tasks(chosen.rows)) for k in ks}
    if not rows:
        return ""
    what = "; ".join(sorted(rows))
    return (f"Chosen on (the setting, and each run's best epoch): {what}."
            + (" A setting chosen on the reported set is optimistic, as the papers that do so say." if "selection on the reported set" in what else ""))


def _tasks(cells):
    return sorted(set(cells["task"]), key=lambda task: order_of(task, TASKS))


def _cell_text(cell, expected):
    """`72.30 ± 1.20 [0.001]`, ` (n=3)` with fewer seeds than expected."""
    if cell is None or is_missing(cell.centre):
        return MISSING
    value = number(cell.centre) + (f" ± {number(cell.spread)}" if not is_missing(cell.spread) else "")
    return value + f" [{cell.value}]" + (f" (n={cell.n})" if cell.n < expected else "")


def _grid(cells):
    """(K, [(method, {task: cell}])) in K order, methods in the paper's order."""
    for k, block in cells.groupby("k", sort=False):
        yield k, [(method, {cell.task: cell for cell in rows.itertuples()})
                  for method, rows in block.groupby("method", sort=False)]


def selection_markdown(cells, chosen, caption, expected):
    parts = [f"# Selected on dev: {chosen.label}", "", caption, ""]
    if cells.empty:
        parts += ["No cell has a candidate with a dev and a test score.", ""]
    tasks = _tasks(cells)
    for k, rows in _grid(cells):
        lines = [[method_label(method), *(_cell_text(by_task.get(task), expected) for task in tasks)]
                 for method, by_task in rows]
        parts += [f"## {k_label(k)}", "", frame_markdown(pd.DataFrame(lines, columns=["Method", *map(task_label, tasks)])), ""]
    if chosen.notes:
        parts += ["Notes (a grid with missing seeds is never compared on unequal seed sets):", "",
                  *(f"- {note}" for note in chosen.notes), ""]
    return "\n".join(parts)


def selection_latex(cells, caption, expected):
    tasks = _tasks(cells)
    lines = [*latex._opening("l" + "r" * len(tasks), wide=True),
             latex._row(["Method", *(latex.escape(task_label(task)) for task in tasks)])]
    for k, rows in _grid(cells):
        lines += [r"\midrule", rf"\multicolumn{{{len(tasks) + 1}}}{{c}}{{[${k_label(k)}$]}} \\", r"\midrule"]
        for method, by_task in rows:
            lines.append(latex._row([latex.escape(method_label(method)),
                                     *(_latex_cell(by_task.get(task), expected) for task in tasks)]))
    return "\n".join(lines + latex._closing(caption, "tab:selection", wide=True)) + "\n"


def _latex_cell(cell, expected):
    """`72.30$_{1.20}$ {\\scriptsize[0.001]}`: the std as subscript, as Table 1 sets it, then the chosen value."""
    if cell is None or is_missing(cell.centre):
        return latex.MISSING
    spread = f"_{{{number(cell.spread)}}}" if not is_missing(cell.spread) else ""
    seeds = rf"^{{\mathrm{{n={cell.n}}}}}" if cell.n < expected else ""
    marks = f"${spread}{seeds}$" if spread or seeds else ""
    return rf"{number(cell.centre)}{marks} {{\scriptsize[{latex.escape(cell.value)}]}}"
