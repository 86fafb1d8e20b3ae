"""`peltbench-params`: trainable parameters stored per task, for every method, without loading weights.

The count is docs/protocol.md §4's (head excluded; prefix-tuning counted as its final L × 2 × layers × H tensor),
the same function the result record and Table 4 use. Models are built on PyTorch's meta device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from . import UserError
from .methods import count_method
from .packaged import method_file, options, shadowing, use_searchpath

# The paper's order (Table 1, then Table 3's NoGate, then the LN-tuning paper's methods); others follow.
PAPER_ORDER = ("ft", "bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_apl",
               "unipelt_ap_nogate", "unipelt_apl_nogate", "ln", "prefix_ln", "mam", "mam_he")


def count_packaged(method: str, config, label_words: int | None = None) -> dict[str, int]:
    """The counts of a method by its name: peltbench's (`conf/method/<method>.yaml`) or, with --config-dir, the
    user's (packaged.method_file); `label_words`: under objective=cloze, with a head of that many label words."""
    return count_method(method_file(method), config, label_words)


def user_methods(folders: list[str]) -> list[str]:
    """The methods of the user's config folders (DIR/method/*.yaml), a UserError for one peltbench ships a method of
    that name of (Hydra would never find the user's)."""
    use_searchpath([f"file://{folder}" for folder in folders])
    shadowed = shadowing("method")
    if shadowed:
        raise UserError(f"{shadowed[0]}: peltbench ships a method of that name; give yours a name of its own")
    return sorted({path.stem for folder in folders for path in Path(folder, "method").glob("*.yaml")})


def paper_rounding(count: int) -> str:
    """Table 4's style: thousands below a million (895K), two significant digits above (1.1M, 110M)."""
    if count < 1_000_000:
        return f"{round(count / 1000)}K"
    digits = len(str(count)) - 2
    rounded = round(count, -digits)
    return f"{rounded / 1e6:g}M"


def model_config(name: str | None, num_labels: int):
    """The config of `name` (checked to be a supported encoder), or bert-base-uncased's shape when None; and a label
    for it."""
    from transformers import BertConfig

    if name is None:
        return BertConfig(num_labels=num_labels), "bert-base-uncased shape (transformers' BertConfig defaults)"
    from .model import load_config

    return load_config(name, num_labels), name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="peltbench-params", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="Hub id or local checkpoint whose config.json to use (default: bert-base-uncased's shape, offline)")
    parser.add_argument("--num-labels", type=int, default=2, help="classes of the head (1 for STS-B); default 2")
    parser.add_argument("--objective", choices=("classifier", "cloze"), default="classifier",
                        help="cloze: the head is the masked-LM head's label-word rows (one per class; 2 for a "
                             "regression's poles) on the model's *ForMaskedLM (docs/protocol.md §12.2)")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="a config folder of your own (as hydra.searchpath=[file://DIR]): its methods "
                             "(DIR/method/*.yaml) are counted after peltbench's; repeatable")
    args = parser.parse_args(argv)
    try:
        config, label = model_config(args.model, args.num_labels)
        users = user_methods(args.config_dir)
    except UserError as error:
        sys.exit(f"peltbench-params: error: {error}")
    methods = sorted(options("method"), key=lambda m: (PAPER_ORDER.index(m) if m in PAPER_ORDER else len(PAPER_ORDER), m))
    methods += users
    words = (max(2, args.num_labels) if args.objective == "cloze" else None)  # a regression's two poles
    rows = [(method, *counted(method, config, words)) for method in methods]
    backbone = next(c["backbone_params"] for _, c, _ in rows if c is not None)
    if args.csv:  # a method the model cannot take: its counts empty
        print("method,trainable_params,percent_of_backbone,head_params,optimizer_params,backbone_params")
        for method, c, _ in rows:
            if c is None:
                print(f"{method},,,,,{backbone}")
                continue
            share = 100 * c["trainable_params"] / c["backbone_params"]
            print(f"{method},{c['trainable_params']},{share:.4f},{c['head_params']},{c['optimizer_params']},{c['backbone_params']}")
        return
    head = f"{words} label words' masked-LM rows (objective=cloze)" if words else f"{args.num_labels}-way head"
    print(f"Trainable parameters stored per task — model: {label}, {head}")
    print("(docs/protocol.md §4: head excluded; prefix counted as its L x 2 x layers x H tensor)\n")
    print(f"{'method':<20}{'stored':>14}{'Table 4':>9}{'% backbone':>12}{'head':>12}{'optimiser':>14}")
    for method, c, why in rows:
        if c is None:
            print(f"{method:<20}{'–':>14}  not on this model: {why}")
            continue
        share = 100 * c["trainable_params"] / c["backbone_params"]
        print(f"{method:<20}{c['trainable_params']:>14,}{paper_rounding(c['trainable_params']):>9}"
              f"{share:>11.2f}%{c['head_params']:>12,}{c['optimizer_params']:>14,}")
    print(f"\nbackbone (the pretrained model without the new head layers): {backbone:,} parameters")


def counted(method: str, config, label_words: int | None = None) -> tuple[dict[str, int] | None, str | None]:
    """(counts, None), or (None, why) for a packaged method the model cannot take as configured (C3A's block size 128
    on a model whose width it does not divide)."""
    try:
        return count_packaged(method, config, label_words), None
    except (ValueError, UserError) as error:
        return None, str(error)


if __name__ == "__main__":
    main()
