"""LaTeX (booktabs) renderings of Tables 1-4, set like the paper: std as subscript, best bold, 2nd underlined.

Each file is a `table` / `table*` float to `\\input` into a paper that loads booktabs and graphicx.
"""
from .formatting import apart_title, blocks, center, is_missing, larger_of_pair, number, param_count, percent, seeds_note, spread
from .names import AVG, EFFICIENCY_METHODS, k_label, method_label, task_label

LATEX_SPECIALS = {"\\": r"\textbackslash{}", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "–": "--", "−": "-", "±": r"$\pm$"}
MISSING = "--"


def escape(text):
    return "".join(LATEX_SPECIALS.get(char, char) for char in str(text))


def score_table_latex(table, caption, label, block_title, expected, table_name, significant=frozenset()):
    """Table 1 or 3 as one tabular with a `[K = ...]` block per K, as in the paper.

    Cells in `significant` carry `$^*$` as in table1.md; methods the paper's table does not have follow a
    rule and an italic line, unranked.
    """
    columns = (*table.tasks, AVG)
    lines = [*_opening("l" + "r" * len(columns), wide=True),
             _row(["Method", *(escape(task_label(task)) for task in columns)])]
    for k, rows in blocks(table.cells):
        lines += [r"\midrule", rf"\multicolumn{{{len(columns) + 1}}}{{c}}{{{block_title(k)}}} \\", r"\midrule"]
        separated = False
        for method, cells, paper_row in rows:
            if not paper_row and not separated:
                lines += [r"\midrule", rf"\multicolumn{{{len(columns) + 1}}}{{l}}{{\textit{{{escape(apart_title(table_name))}}}}} \\"]
                separated = True
            lines.append(_row([escape(method_label(method)),
                               *(score_cell(cells[task], expected, (k, method, task) in significant) for task in columns)]))
    lines += _closing(caption, label, wide=True)
    # Runs left out are listed as comments, so the table pastes as is and the record of them stays.
    lines += [f"% left out: {run.method}, {run.task}, {k_label(run.k)}, seed {run.seed}: {_comment(run.reason)}"
              for run in table.problems.itertuples()]
    return "\n".join(lines) + "\n"


def _comment(text):
    """A TeX comment ends at the line's end: keep an error message on one line."""
    return " ".join(str(text).split())


def score_cell(cell, expected, significant=False):
    """`\\textbf{79.61}$_{4.25}^{*}$`: the mean bold or underlined by rank, the std as subscript, `*` when
    significant, and a superscript seed count (`$^{n=3}$`) when seeds are missing; narrow enough for a page."""
    if cell.n == 0 or is_missing(center(cell)):
        return MISSING
    shown = number(center(cell))
    mean = {1: rf"\textbf{{{shown}}}", 2: rf"\underline{{{shown}}}"}.get(cell.rank, shown)
    std = number(spread(cell)) if spread(cell) is not None else ""
    marks = ",".join(filter(None, ["*" if significant else "", seeds_note(cell, expected)]))
    if not std and not marks:
        return mean
    return mean + "$" + (f"_{{{std}}}" if std else "") + (rf"^{{\mathrm{{{marks}}}}}" if marks else "") + "$"


def upper_bound_latex(bounds, caption, label):
    """Table 2 with the larger number of each pair in bold."""
    lines = [*_opening("lrrrr"),
             _row(["$K$", r"$\max(\{A, P\})$", "UniPELT", r"$\max(\{A, P, L\})$", "UniPELT"]), r"\midrule"]
    for k, row in bounds.iterrows():
        pairs = [(row["upper_ap"], row["unipelt_ap"]), (row["upper_apl"], row["unipelt_apl"])]
        cells = [_bold(value, bold) for pair in pairs for value, bold in zip(pair, larger_of_pair(*pair))]
        lines.append(_row([k, *cells]))
    return "\n".join(lines + _closing(caption, label)) + "\n"


def _bold(value, bold):
    if is_missing(value):
        return MISSING
    return rf"\textbf{{{number(value)}}}" if bold else number(value)


def efficiency_latex(table, caption, label):
    """Table 4: #Param. (% of the backbone), Time_T and Time_I relative to fine-tuning; methods the paper's
    Table 4 does not have follow a rule and an italic line."""
    lines = [*_opening("lrrr"), _row(["Method", r"\#Param.", "Time$_T$", "Time$_I$"]), r"\midrule"]
    separated = False
    for method, row in table.iterrows():
        if method not in EFFICIENCY_METHODS and not separated:
            lines += [r"\midrule", rf"\multicolumn{{4}}{{l}}{{\textit{{{escape(apart_title('Table 4'))}}}}} \\"]
            separated = True
        params = f"{param_count(row['trainable_params'])} ({percent(row['params_percent'])})"
        times = [percent(row["train_time_percent"]), percent(row["inference_time_percent"])]
        lines.append(_row([escape(method_label(method)), *(escape(text) for text in (params, *times))]))
    return "\n".join(lines + _closing(caption, label)) + "\n"


def _row(cells):
    return " & ".join(str(cell) for cell in cells) + r" \\"


def _opening(column_spec, wide=False):
    """Table 1 and 3 span both columns of an ACL paper (`table*`), as the paper's do; 2 and 4 take one column.

    The tabular is scaled down to the line width only when it is wider (8 tasks with std subscripts are
    about 600pt in \\small; an ACL page is 455pt, a column 219pt), never up. Needs booktabs and graphicx.
    """
    environment = "table*" if wide else "table"
    return [rf"\begin{{{environment}}}[t]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
            r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
            rf"\begin{{tabular}}{{{column_spec}}}", r"\toprule"]


def _closing(caption, label, wide=False):
    environment = "table*" if wide else "table"
    return [r"\bottomrule", r"\end{tabular}}", rf"\caption{{{escape(caption)}}}", rf"\label{{{label}}}",
            rf"\end{{{environment}}}"]
