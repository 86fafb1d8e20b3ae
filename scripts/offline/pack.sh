#!/usr/bin/env bash
# On a machine with network, after make install (make pack-offline): writes .offline/ for a GPU node without network
# whose Python already has a CUDA torch (README, "Offline GPU node"), to install there in one pass whatever else the
# node has: every package peltbench[peft] needs but torch and its CUDA libraries, resolved by pip under
# constraints.txt for the node's Python and platform (scripts/offline/offline.py wheels); pip, setuptools and wheel
# (the node's pip may be missing or too old for an editable install; they build peltbench there); the MiniLM
# checkpoint; install.sh and offline.py. Copy the checkout with .offline/ to the node and run bash .offline/install.sh.
# What the pack needs to know about the node, printed first:
#   PY=3.12          the node's Python (major.minor): the wheels are for it
#   ARCH=x86_64      the node's machine (aarch64 for Grace nodes); GLIBC=2.28: the oldest glibc its wheels may need
#   EXTRA="a b==1"   more packages, with what they need (pinned from constraints.txt unless NAME==VERSION)
#   MINILM_PACK=fp32 the checkpoint as installed (88 MB); fp16: half the size, restored to fp32 within fp16 rounding
#                    (not bit-identical); none: no checkpoint. (Not MINILM=: the README and the Makefile use that
#                    name for the checkpoint's folder, which make exports.)
#   OUT=.offline     where to write (replaced if it holds an earlier pack); VENV=.venv: make install's environment
# A failure ends with one line naming the step that failed, and exit status 2.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root"
PY=${PY:-3.12} ARCH=${ARCH:-x86_64} GLIBC=${GLIBC:-2.28} EXTRA=${EXTRA:-} MINILM_PACK=${MINILM_PACK:-fp32}
OUT=${OUT:-.offline}
step="checking the settings"; said=
fail() { echo "pack.sh: $*" >&2; said=1; exit 2; }
trap 'status=$?; [[ $status == 0 || -n $said ]] || echo "pack.sh: FAILED while $step (the lines above say why)" >&2' EXIT
[[ $PY =~ ^3\.[0-9]+$ ]] || fail "PY=$PY: give the node's Python as major.minor, e.g. PY=3.12"
[[ $ARCH =~ ^[a-z0-9_]+$ ]] || fail "ARCH=$ARCH: give the node's machine as uname -m says, e.g. ARCH=x86_64"
[[ $GLIBC =~ ^2\.[0-9]+$ ]] || fail "GLIBC=$GLIBC: give it as 2.N, e.g. GLIBC=2.28 (ldd --version on the node)"
[[ $MINILM_PACK =~ ^(fp32|fp16|none)$ ]] || fail "MINILM_PACK=$MINILM_PACK: fp32, fp16 or none"
[[ -z ${NODE:-} ]] || echo "pack.sh: NODE= is not needed any more (the pack carries everything but torch): ignored"
py=${VENV:-.venv}/bin/python   # the environment make install made: pip, MiniLM
[[ -x $py ]] || fail "no $py: run make install first"
echo "pack.sh: for a node whose python3 is Python $PY on $ARCH, glibc $GLIBC or newer, with a torch: everything else" \
  "peltbench needs is carried (PY=, ARCH=, GLIBC= for another node)"
if [[ -e $OUT ]]; then
  [[ -f $OUT/.peltbench-pack || -f $OUT/packed.txt || -z $(ls -A "$OUT") ]] \
    || fail "OUT=$OUT exists and holds no earlier pack: choose another OUT"
  rm -rf "$OUT"
fi
mkdir -p "$OUT/tools"
touch "$OUT/.peltbench-pack"   # ours, even if this pack stops half-way: a later one replaces it

step="resolving and fetching the wheels (offline.py wheels)"
$py "$here/offline.py" wheels "$OUT" --python "$PY" --arch "$ARCH" --glibc "$GLIBC" --extra "$EXTRA" \
  || { said=1; exit 2; }
step="fetching pip, setuptools and wheel"
$py -m pip download -q --only-binary=:all: --python-version "$PY" -d "$OUT/tools" pip setuptools wheel
if [[ $MINILM_PACK != none ]]; then
  step="packing MiniLM"
  halve=(); [[ $MINILM_PACK == fp32 ]] || halve=(--fp16)
  $py "$here/offline.py" minilm-pack "$OUT/minilm" ${halve[@]+"${halve[@]}"} || { said=1; exit 2; }
fi
step="writing $OUT"
cp "$here/install.sh" "$here/offline.py" "$OUT/"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
printf 'PY=%s\nARCH=%s\nGLIBC=%s\nMINILM_PACK=%s\nCOMMIT=%s\n' "$PY" "$ARCH" "$GLIBC" "$MINILM_PACK" "$commit" \
  > "$OUT/packed.txt"
torch=$(cut -f1 "$OUT/torch.txt" | sed 's/^torch//' | paste -sd, -)
echo "pack.sh: $OUT ($(du -sh "$OUT" | cut -f1)): $(wc -l < "$OUT/carried.txt") packages for Python $PY on $ARCH" \
  "($OUT/carried.txt), pip, ${MINILM_PACK/none/no} MiniLM; the node's torch must be ${torch:-any}"
echo "pack.sh: copy the checkout to the node with this folder in its root; there: bash $(basename "$OUT")/install.sh"
