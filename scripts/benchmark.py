"""Training-step and inference time of every method relative to fine-tuning (the paper's Table 4, §4.4).

Random weights of the model's shape (speed does not depend on the weights, and nothing is downloaded),
fixed random batches, warm-up steps first, then the median over timed steps, the methods taking turns
step by step; one process, one device, so the ratios compare like with like. Examples:

    python scripts/benchmark.py                          # bert-base-uncased shape, batch 16 x 128 tokens
    python scripts/benchmark.py --model /path/to/minilm --steps 5 --methods ft adapter lora unipelt_apl
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from peltbench.methods import build_pelt_model
from peltbench.packaged import options, packaged_config
from peltbench.params import PAPER_ORDER, model_config


def _batch(config, batch: int, length: int, device: torch.device) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1, config.vocab_size, (batch, length), generator=generator).to(device),
        "attention_mask": torch.ones(batch, length, dtype=torch.long, device=device),
        "token_type_ids": torch.zeros(batch, length, dtype=torch.long, device=device),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(step, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - start


def prepare(method: str, config, args, device: torch.device):
    """The method's model on the device, and its train and inference step (each one batch)."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = build_pelt_model(BertForSequenceClassification(config), packaged_config(f"method/{method}.yaml"), 42).to(device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-5, fused=device.type == "cuda")
    train_batch = _batch(config, args.batch, args.length, device)
    eval_batch = _batch(config, args.eval_batch, args.length, device)
    labels = torch.zeros(args.batch, dtype=torch.long, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def train_step():
        model.train()
        with autocast:
            logits = model(**train_batch)
        F.cross_entropy(logits.float(), labels).backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @torch.inference_mode()
    def eval_step():
        model.eval()
        with autocast:
            model(**eval_batch)

    return train_step, eval_step


def measure(methods: list[str], config, args, device: torch.device) -> dict[str, tuple[float, float]]:
    """Median seconds per train step and per inference batch. The methods take turns, one step each per round,
    so a machine that speeds up or slows down during the benchmark affects all of them alike."""
    steps = {method: prepare(method, config, args, device) for method in methods}
    for train_step, eval_step in steps.values():
        for _ in range(args.warmup):
            train_step()
            eval_step()
    times: dict[str, tuple[list[float], list[float]]] = {method: ([], []) for method in methods}
    for _ in range(args.steps):
        for method, (train_step, eval_step) in steps.items():
            times[method][0].append(_time_once(train_step, device))
            times[method][1].append(_time_once(eval_step, device))
    return {method: (statistics.median(t), statistics.median(i)) for method, (t, i) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="Hub id or local checkpoint whose shape to use (default: bert-base-uncased's)")
    parser.add_argument("--methods", nargs="+", default=[m for m in PAPER_ORDER if m in options("method")])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-batch", type=int, default=128)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA, fp32 on CPU")
    args = parser.parse_args()
    device = torch.device(args.device)
    args.bf16 = (args.precision or ("bf16" if device.type == "cuda" else "fp32")) == "bf16"
    config, _ = model_config(args.model, 2)
    methods = ["ft"] + [m for m in args.methods if m != "ft"]
    print(f"device {device} ({'bf16' if args.bf16 else 'fp32'}), model {args.model or 'bert-base-uncased shape'}, "
          f"train batch {args.batch} x {args.length}, eval batch {args.eval_batch}, median of {args.steps} steps, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'method':<20}{'train s/step':>14}{'Time_T':>9}{'eval s/batch':>14}{'Time_I':>9}")
    results = measure(methods, config, args, device)
    reference = results["ft"]
    for method, (train, infer) in results.items():
        print(f"{method:<20}{train:>14.4f}{100 * train / reference[0]:>8.0f}%{infer:>14.4f}{100 * infer / reference[1]:>8.0f}%")


if __name__ == "__main__":
    main()
