"""Number formats shared by the Markdown and LaTeX renderers, in the paper's style (Tables 1-4)."""
import math

MISSING = "–"  # a cell with no score, as the issue asks


def is_missing(value):
    return value is None or (isinstance(value, float) and math.isnan(value))


def number(value):
    """Scores with two decimals, as in Tables 1-3."""
    return MISSING if is_missing(value) else f"{value:.2f}"


def signed(value):
    """A difference with its sign, for "ours − paper"."""
    return MISSING if is_missing(value) else f"{value:+.2f}"


def param_count(count):
    """Table 4's rounding: 103K, 895K, 1.1M, 110M."""
    if is_missing(count):
        return MISSING
    if count >= 10e6:
        return f"{count / 1e6:.0f}M"
    if count >= 1e6:
        return f"{count / 1e6:.1f}M"
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
    best = max(round(bound, 2), round(unipelt, 2))
    return round(bound, 2) == best, round(unipelt, 2) == best


def blocks(cells):
    """Table 1 / 3 cells as (K, [(method, {task: cell})]) in the paper's order (cells arrive sorted)."""
    for k, block in cells.groupby("k", sort=False):
        rows = [
            (method, {cell.task: cell for cell in method_cells.itertuples()})
            for method, method_cells in block.groupby("method", sort=False)
        ]
        yield k, rows


def seeds_note(cell, expected):
    """`n=3` when a cell averages fewer seeds than the sweep runs."""
    return f"n={cell.n}" if 0 < cell.n < expected else ""
