#!/usr/bin/env bash
# Generated once and never again (issue 32, item 1): two records of the same run, `protocol=lmbff method=lora task=cola
# seed=13` on a tiny BERT (hidden 32, 2 layers: tests/conftest.py's tiny_checkpoint, saved at MODEL), 2 steps:
#
#   before_chained.json  written by commit e7cf31c, the last before CoLA's LM-BFF split became the chained one
#                        (10b10cf): its 32 training rows are another split's, and its identity has no `split`
#   chained.json         written by commit 50c7a30 (main before issue 32): the chained split, identity
#                        `split: lmbff-chained`; a rerun must keep taking it as done (its hash and folder unchanged)
#
# tests/test_record_split.py reruns today's code over each. Each commit ran from a `git worktree` outside the clone,
# with this clone's .venv (torch 2.13.0), on the shipped data/glue/CoLA. The records name MODEL as their model; the
# tests never load it (the rerun stops, or skips, before any model loads), so it need not exist where they run.
#
#   bash tests/data/lmbff_cola_split/generate.sh      # from the repository root
set -euo pipefail
REPO=$(pwd)
MODEL=/tmp/peltbench-fixture/tiny-bert
OUT=$(mktemp -d)
mkdir -p "$MODEL"
(cd tests && OMP_NUM_THREADS=1 "$REPO/.venv/bin/python" - "$MODEL" <<'EOF'
import sys
from pathlib import Path

import conftest
from transformers import BertTokenizerFast

folder = Path(sys.argv[1])
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *conftest.WORDS]
vocab += [f"[unused{i}]" for i in range(conftest.TINY["vocab_size"] - len(vocab))]
(folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True).save_pretrained(folder)
conftest.tiny_backbone().save_pretrained(folder)
EOF
)
for pair in e7cf31c:before_chained 50c7a30:chained; do
    commit=${pair%%:*} name=${pair##*:}
    git worktree add --detach "$OUT/$commit" "$commit" >/dev/null
    (cd "$OUT/$commit" && OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1 PYTHONPATH="$OUT/$commit" \
        "$REPO/.venv/bin/python" -c 'import sys; from peltbench.cli import main; sys.argv[0] = "peltbench"; main()' \
        protocol=lmbff method=lora task=cola seed=13 model.name="$MODEL" data.dir="$REPO/data/glue" \
        train.max_steps=2 train.eval_every=1 results_dir="$OUT/results-$name" hydra.run.dir="$OUT/logs-$name")
    cp "$OUT/results-$name"/*/cola/k16/seed13/result.json "tests/data/lmbff_cola_split/$name.json"
    git worktree remove --force "$OUT/$commit"
done
