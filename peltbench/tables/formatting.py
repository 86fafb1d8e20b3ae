"""Number formats shared by the Markdown and LaTeX renderers, in the paper's style (Tables 1-4)."""
import pandas as pd

MISSING = "–"  # a cell with no score, as the issue asks


def is_missing(value):
    """None, NaN or pandas' NA (an integer column with a gap)."""
    return value is None or bool(pd.isna(value))


def number(value):
    """Scores with two decimals, as in Tables 1-3; a value that rounds to zero is `0.00`, never `-0.00`."""
    return MISSING if is_missing(value) else f"{_no_negative_zero(value, 2):.2f}"


def signed(value):
    """A difference with its sign, for "ours − paper" (`+0.00` when it rounds to zero)."""
    return MISSING if is_missing(value) else f"{_no_negative_zero(value, 2):+.2f}"


def printed(value):
    """The number `number()` prints, as a float: what bold / underline must rank (NaN when missing).

    Ranking by `round(2)` of the floats is not enough: numpy rounds 52.535 up to 52.54 while the table
    prints 52.53, so a tie the reader sees would get two ranks.
    """
    return float("nan") if is_missing(value) else float(number(value))


def center(cell):
    """What a score cell prints: its median under a median protocol (full_median), else its mean."""
    return cell.median if getattr(cell, "statistic", "mean") == "median" else cell.mean


def spread(cell):
    """The std a score cell prints beside its mean; none beside a median or for a single seed."""
    return None if getattr(cell, "statistic", "mean") == "median" or cell.n <= 1 else cell.std


def _no_negative_zero(value, decimals):
    return 0.0 if round(value, decimals) == 0 else value


def param_count(count):
    """Table 4's rounding: 103K, 895K (thousands to the unit), 1.1M, 1.4M, 23M, 110M (millions to 2 significant digits)."""
    if is_missing(count):
        return MISSING
    if round(count / 1e3) >= 1000:  # 999,600 is 1M, not "1000K"
        millions = float(f"{count / 1e6:.2g}")  # 109,482,240 -> 110, as the paper prints fine-tuning
        return f"{millions:g}M"
    return f"{count / 1e3:.0f}K" if count >= 1e3 else f"{count:.0f}"


def percent(value):
    """Table 4's percentages: 0.09%, 1.26%, 55%, 100%."""
    if is_missing(value):
        return MISSING
    return f"{value:.2f}%" if value < 10 else f"{value:.0f}%"


def larger_of_pair(bound, unipelt):
    """Table 2 bolds the larger number of each (upper bound, UniPELT) pair as printed; ties bold both."""
    if is_missing(bound) or is_missing(unipelt):
        return False, False
    best = max(printed(bound), printed(unipelt))
    return printed(bound) == best, printed(unipelt) == best


def blocks(cells):
    """Table 1 / 3 cells as (K, [(method, {task: cell}, paper_row)]) in the paper's order (cells arrive sorted,
    rows that are not the paper table's last)."""
    for k, block in cells.groupby("k", sort=False):
        rows = [
            (method, {cell.task: cell for cell in method_cells.itertuples()}, bool(method_cells["paper_row"].iloc[0]))
            for method, method_cells in block.groupby("method", sort=False)
        ]
        yield k, rows


def apart_title(table_name):
    """The line that sets apart the rows a paper table does not have."""
    return f"Not in the paper's {table_name} (not ranked)"


def seeds_note(cell, expected):
    """`n=3` when a cell averages fewer seeds than the sweep runs."""
    return f"n={cell.n}" if 0 < cell.n < expected else ""
