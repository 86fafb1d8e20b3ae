"""Writes data/train.csv and data/test.csv: a movie-review polarity task in the layout of LM-BFF's own data sets (MR,
CR, SST-5, ...: a CSV without a header, the label first, then the text), 400 training rows and 200 test rows taken
from the shipped SST-2 (data/glue/SST-2/train.tsv, every 150th row from the start; test: every 150th from row 75).
Run from the repository root: python examples/own_task/make_data.py"""

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
SST2 = HERE.parents[1] / "data" / "glue" / "SST-2" / "train.tsv"

with open(SST2, newline="", encoding="utf-8") as handle:
    rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
for name, start, count in (("train", 0, 400), ("test", 75, 200)):
    chosen = rows[start::150][:count]
    with open(HERE / "data" / f"{name}.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([label, sentence.strip()] for sentence, label in chosen)
