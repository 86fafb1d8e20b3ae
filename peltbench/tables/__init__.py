"""The paper's Tables 1-4 and Figures 2-3 from result records, beside the paper's own numbers.

`main()` is the `peltbench-tables` console entry (`make tables`); `load_records(results_dir)` reads
every result.json into one pandas DataFrame with flat columns, for notebooks too (`read_records` also
returns the files it could not read).
"""
from .command import main
from .records import load_records, read_records

__all__ = ["main", "load_records", "read_records"]
