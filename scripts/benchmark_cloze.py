"""A cloze training step against a classifier step (issue 57's target: at most 1.1x), on random-weight models of
MiniLM's and bert-base's shapes (no checkpoint needed): the same method, rows and lengths, one training step of
peltbench's loop (`train._train_steps`: forward, loss, backward, clipping, AdamW) each. Prints the aten operators each
step dispatches (a GPU launches at least one kernel for each) and the median wall time of alternating rounds.

    python scripts/benchmark_cloze.py --shape minilm --method lora --rounds 7 --threads 1
    python scripts/benchmark_cloze.py --shape minilm --method lora --members 4   # a fused group of 4 runs each
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_fused import OperatorCount  # noqa: E402

from peltbench.data import Encoded  # noqa: E402
from peltbench.methods import build_pelt_model  # noqa: E402
from peltbench.methods.base import Cloze  # noqa: E402
from peltbench.packaged import packaged_config  # noqa: E402
from peltbench.tasks import TaskSpec  # noqa: E402
import peltbench.train as train  # noqa: E402

SHAPES = {"tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),  # tests
          "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
          "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}
MASK, CLS, SEP = 103, 101, 102  # bert-base-uncased's [MASK] [CLS] [SEP]
LABEL_WORDS = (6659, 2307)       # its "terrible", "great"


def rows(count: int, length: int, seed: int = 0) -> Encoded:
    """SST-2-like rows of a template `[CLS] sentence It was [MASK] . [SEP]`: random words, the mask near the end."""
    generator = torch.Generator().manual_seed(seed)
    ids = []
    for n in torch.randint(length // 2, length, (count,), generator=generator).tolist():
        words = torch.randint(1000, 30000, (n - 6,), generator=generator).tolist()
        ids.append([CLS, *words, 2009, 2001, MASK, 1012, SEP])
    return Encoded(ids, [[0] * len(i) for i in ids], torch.randint(0, 2, (count,), generator=generator).numpy())


def step_of(objective: str, shape: str, method_name: str, batch: int, length: int, size: int = 1):
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    config = BertConfig(vocab_size=30522, num_labels=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                        **SHAPES[shape])
    torch.manual_seed(0)
    method = OmegaConf.create(OmegaConf.to_container(packaged_config(f"method/{method_name}.yaml")))
    seeds = [42 + member for member in range(size)]  # `size` members: a fused group of that many runs
    if objective == "cloze":
        model = build_pelt_model(BertForMaskedLM(config), [method] * size, seeds,
                                 cloze=Cloze((LABEL_WORDS,) * size, MASK))
    else:
        model = build_pelt_model(BertForSequenceClassification(config), [method] * size, seeds)
    data = rows(batch * 4, length)
    members = [train.Member(f"m{seed}", data, data, data, train.TrainSettings(lr=1e-4, seed=seed, data_seed=0))
               for seed in seeds]
    group = train.GroupSettings(batch_size=batch, split_by_length=True, members_per_pass=max(1, 64 // batch))
    task = TaskSpec.from_config(packaged_config("task/sst2.yaml"))
    started = train.start_training(model, members, group)
    active = list(range(size))
    model.members.set_active(active, group.device)
    counter = iter(range(10**6))
    return lambda: train._train_steps(model, members, active, task, group, *started[1:], next(counter) % 4, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="minilm")
    parser.add_argument("--method", default="lora")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--members", type=int, default=1, help="a fused group of this many runs (issue 57: as cheap "
                        "per member under cloze as under the classifier)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps = {objective: step_of(objective, args.shape, args.method, args.batch, args.length, args.members)
             for objective in ("classifier", "cloze")}
    for objective, step in steps.items():
        step()  # the optimiser's state and caches made
        with OperatorCount() as count:
            step()
        print(f"{objective}: {count.count} operators per training step of {args.members} member(s)")
    times = {objective: [] for objective in steps}
    cpu = {objective: [] for objective in steps}  # the process's CPU seconds: less moved by other jobs than wall time
    for _ in range(args.rounds):
        for objective, step in steps.items():  # alternating: a loaded machine slows both alike
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            times[objective].append(time.perf_counter() - start)
            cpu[objective].append(time.process_time() - start_cpu)
    for name, measured in (("wall", times), ("cpu", cpu)):
        medians = {objective: statistics.median(values) for objective, values in measured.items()}
        for objective, median in medians.items():
            print(f"{objective}: median {name} {median * 1000:.1f} ms per step ({args.rounds} rounds)")
        print(f"cloze / classifier ({name}): {medians['cloze'] / medians['classifier']:.3f}")


if __name__ == "__main__":
    main()
