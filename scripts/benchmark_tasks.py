"""A task of your own against the packaged GLUE path (issue 46's targets; docs/tasks.md quotes the numbers):

1. reading and splitting the shipped SST-2 (67,349 train rows, 872 test rows; K = 100, dev 1,000): `task=sst2
   data.dir=data/glue` (glue_data TSV) against the same rows as JSON Lines through a task file of one's own, CPU
   seconds of load_split (both splits) and few_shot_split, alternating, medians of `--rounds` after a warm-up;
2. a bad task file refused by the real command (a label outside its label names): wall seconds, from the command's
   start to its one-line error (the process imports peltbench, reads the file; no torch).

    python scripts/benchmark_tasks.py [--rounds 7]
"""

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # conftest's compose_config: a run's config as the command composes it

TASK = """name: sst2_jsonl
text: [sentence]
label: label
num_labels: 2
label_names: {names}
metrics: [accuracy]
main_metric: accuracy
max_length: 128
files: {{train: {root}/train.jsonl, test: {root}/dev.jsonl}}
"""


def write_jsonl(root: Path) -> None:
    for name in ("train", "dev"):
        with open(REPO / "data" / "glue" / "SST-2" / f"{name}.tsv", newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        with open(root / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for sentence, label in rows:
                handle.write(json.dumps({"sentence": sentence, "label": int(label)}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from conftest import compose_config

    from peltbench.data import few_shot_split, load_split
    from peltbench.tasks import TaskSpec

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_jsonl(root)
        (root / "conf" / "task").mkdir(parents=True)
        (root / "conf" / "task" / "sst2_jsonl.yaml").write_text(TASK.format(root=root, names="null"))
        search = f"hydra.searchpath=[file://{root / 'conf'}]"
        sides = {"glue_data TSV (task=sst2)": (TaskSpec.from_config(compose_config("method=lora", "task=sst2").task),
                                                str(REPO / "data" / "glue")),
                 "JSON Lines (a task file)": (TaskSpec.from_config(
                     compose_config("method=lora", "task=sst2_jsonl", search).task), None)}

        def once(task, data_dir) -> float:
            load_split.cache_clear()
            start = time.process_time()
            train = load_split(task, data_dir, "train")
            load_split(task, data_dir, "test")
            few_shot_split(len(train), 100, 111, 1000)
            return time.process_time() - start

        times = {name: [] for name in sides}
        for name, side in sides.items():
            once(*side)  # warm-up: imports, the page cache
        for _ in range(args.rounds):
            for name, side in sides.items():
                times[name].append(once(*side))
        for name, values in times.items():
            print(f"read and split SST-2, {name}: median {statistics.median(values):.3f} CPU s "
                  f"({', '.join(f'{v:.3f}' for v in values)})")

        (root / "conf" / "task" / "sst2_jsonl.yaml").write_text(TASK.format(root=root, names="[neg, pos]"))
        (root / "dev.jsonl").write_text('{"sentence": "a film", "label": "positive"}\n')  # not one of the names
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        result = subprocess.run([str(Path(sys.executable).with_name("peltbench")), "method=lora", "task=sst2_jsonl",
                                 search], cwd=root, env=env, capture_output=True, text=True, timeout=300)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        print(f"bad task file refused in {wall:.2f} s wall ({cpu:.2f} CPU s), exit status {result.returncode}: "
              f"{result.stderr.strip()}")


if __name__ == "__main__":
    main()
