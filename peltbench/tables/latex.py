"""LaTeX (booktabs) renderings of Tables 1-4, set like the paper: std as subscript, best bold, 2nd underlined."""
from .formatting import blocks, is_missing, larger_of_pair, number, param_count, percent, seeds_note
from .names import AVG, k_label, method_label, task_label

LATEX_SPECIALS = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "–": "--", "−": "-", "±": r"$\pm$"}
MISSING = "--"


def escape(text):
    return "".join(LATEX_SPECIALS.get(char, char) for char in str(text))


def score_table_latex(table, caption, label, block_title, expected):
    """Table 1 or 3 as one tabular with a `[K = ...]` block per K, as in the paper."""
    columns = (*table.tasks, AVG)
    lines = [*_opening("l" + "r" * len(columns), wide=True),
             _row(["Method", *(task_label(task) for task in columns)])]
    for k, rows in blocks(table.cells):
        lines += [r"\midrule", rf"\multicolumn{{{len(columns) + 1}}}{{c}}{{{block_title(k)}}} \\", r"\midrule"]
        lines += [_row([escape(method_label(method)), *(score_cell(cells[task], expected) for task in columns)])
                  for method, cells in rows]
    lines += _closing(caption, label, wide=True)
    # Runs left out are listed as comments, so the table pastes as is and the record of them stays.
    lines += [f"% left out: {run.method}, {run.task}, {k_label(run.k)}, seed {run.seed}: {run.reason}"
              for run in table.problems.itertuples()]
    return "\n".join(lines) + "\n"


def score_cell(cell, expected):
    """`\\textbf{79.61}$_{4.25}$`: the mean bold or underlined by rank, the std as subscript, `(n=3)` if seeds are missing."""
    if cell.n == 0 or is_missing(cell.mean):
        return MISSING
    mean = {1: rf"\textbf{{{number(cell.mean)}}}", 2: rf"\underline{{{number(cell.mean)}}}"}.get(cell.rank, number(cell.mean))
    std = f"$_{{{number(cell.std)}}}$" if cell.n > 1 else ""
    note = seeds_note(cell, expected)
    return mean + std + (rf" {{\scriptsize({note})}}" if note else "")


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
    """Table 4: #Param. (% of the backbone), Time_T and Time_I relative to fine-tuning."""
    lines = [*_opening("lrrr"), _row(["Method", r"\#Param.", "Time$_T$", "Time$_I$"]), r"\midrule"]
    for method, row in table.iterrows():
        params = f"{param_count(row['trainable_params'])} ({percent(row['params_percent'])})"
        times = [percent(row["train_time_percent"]), percent(row["inference_time_percent"])]
        lines.append(_row([escape(method_label(method)), *(escape(text) for text in (params, *times))]))
    return "\n".join(lines + _closing(caption, label)) + "\n"


def _row(cells):
    return " & ".join(str(cell) for cell in cells) + r" \\"


def _opening(column_spec, wide=False):
    """Table 1 and 3 span both columns of an ACL paper (`table*`), as the paper's do."""
    environment = "table*" if wide else "table"
    return [rf"\begin{{{environment}}}[t]", r"\centering", r"\small",
            rf"\begin{{tabular}}{{{column_spec}}}", r"\toprule"]


def _closing(caption, label, wide=False):
    environment = "table*" if wide else "table"
    return [r"\bottomrule", r"\end{tabular}", rf"\caption{{{escape(caption)}}}", rf"\label{{{label}}}",
            rf"\end{{{environment}}}"]
