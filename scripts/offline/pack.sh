#!/usr/bin/env bash
# On a machine with network, after make install (make pack-offline): writes .offline/ for a GPU node without network
# whose Python already has a CUDA torch (README, "Offline GPU node"): the locked wheels the node lacks, pip (the node's
# may be missing or too old for an editable install), setuptools and wheel with what they need (to build peltbench), the MiniLM
# checkpoint, install.sh and offline.py. Copy the checkout with .offline/ to the node and run bash .offline/install.sh.
#   PY=3.12          the node's Python (major.minor): the wheels are for it
#   ARCH=x86_64      the node's machine (aarch64 for Grace nodes); GLIBC=2.28: the oldest glibc its wheels may need
#   EXTRA="a b==1"   more packages (pinned from constraints.txt unless NAME==VERSION)
#   NODE=list.txt    the node's `python3 -m pip list --format=freeze`: carry what peltbench needs that it lacks,
#                    instead of the default (what an H100 node lacked: scripts/offline/offline.py DEFAULT)
#   MINILM_PACK=fp32 the checkpoint as installed (88 MB); fp16: half the size, restored to fp32 within fp16 rounding
#                    (not bit-identical); none: no checkpoint. (Not MINILM=: the README and the Makefile use that
#                    name for the checkpoint's folder, which make exports.)
#   OUT=.offline     where to write (replaced if it holds an earlier pack); VENV=.venv: make install's environment
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root"
PY=${PY:-3.12} ARCH=${ARCH:-x86_64} GLIBC=${GLIBC:-2.28} EXTRA=${EXTRA:-} NODE=${NODE:-} MINILM_PACK=${MINILM_PACK:-fp32}
OUT=${OUT:-.offline}
fail() { echo "pack.sh: $*" >&2; exit 2; }
[[ $PY =~ ^3\.[0-9]+$ ]] || fail "PY=$PY: give the node's Python as major.minor, e.g. PY=3.12"
[[ $GLIBC =~ ^2\.[0-9]+$ ]] || fail "GLIBC=$GLIBC: give it as 2.N, e.g. GLIBC=2.28 (ldd --version on the node)"
[[ $MINILM_PACK =~ ^(fp32|fp16|none)$ ]] || fail "MINILM_PACK=$MINILM_PACK: fp32, fp16 or none"
[[ -z $NODE || -f $NODE ]] || fail "NODE=$NODE: no such file (on the node: python3 -m pip list --format=freeze > $NODE)"
py=${VENV:-.venv}/bin/python   # the environment make install made: pip, the pins' metadata, MiniLM
[[ -x $py ]] || fail "no $py: run make install first"
if [[ -e $OUT ]]; then
  [[ -f $OUT/packed.txt || -z $(ls -A "$OUT") ]] || fail "OUT=$OUT exists and holds no earlier pack: choose another OUT"
  rm -rf "$OUT"
fi
mkdir -p "$OUT/wheels" "$OUT/tools"
pins=$($py "$here/offline.py" carry --python "$PY" --extra "$EXTRA" ${NODE:+--node "$NODE"}) || exit 2

# Wheels for the node's Python and platform; a package with only a source release comes as an sdist (allowed with
# --no-deps) and is built here, which is right only for a pure-Python one.
platforms=()
for ((minor = ${GLIBC#2.}; minor >= 5; minor--)); do platforms+=(--platform "manylinux_2_${minor}_$ARCH"); done
platforms+=(--platform "manylinux2014_$ARCH")
[[ $ARCH != x86_64 ]] || platforms+=(--platform manylinux2010_x86_64 --platform manylinux1_x86_64)
target=(--python-version "$PY" --implementation cp "${platforms[@]}")
# shellcheck disable=SC2086  # $pins: one name==version a word
[[ -z $pins ]] || $py -m pip download -q --no-deps "${target[@]}" -d "$OUT/wheels" $pins \
  || fail "pip download failed (above): a pinned version with no wheel for Python $PY on $ARCH (glibc $GLIBC)?"
for sdist in "$OUT"/wheels/*.tar.gz "$OUT"/wheels/*.zip; do
  [[ -e $sdist ]] || continue
  built=$(mktemp -d)
  $py -m pip wheel -q --no-deps -w "$built" "$sdist" || fail "building a wheel of $(basename "$sdist") failed (above)"
  for wheel in "$built"/*.whl; do
    [[ $wheel == *-none-any.whl ]] \
      || fail "$(basename "$sdist") has no wheel for Python $PY on $ARCH on PyPI, and its build here is for this machine only"
    mv "$wheel" "$OUT/wheels/"
  done
  rm -rf "$built" "$sdist"
done
$py -m pip download -q --only-binary=:all: --python-version "$PY" -d "$OUT/tools" pip setuptools wheel \
  || fail "pip download of pip, setuptools and wheel failed (above)"

if [[ $MINILM_PACK != none ]]; then
  halve=(); [[ $MINILM_PACK == fp32 ]] || halve=(--fp16)
  $py "$here/offline.py" minilm-pack "$OUT/minilm" ${halve[@]+"${halve[@]}"} || fail "packing MiniLM failed (above)"
fi
cp "$here/install.sh" "$here/offline.py" "$OUT/"
echo "$pins" > "$OUT/carried.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
printf 'PY=%s\nARCH=%s\nGLIBC=%s\nMINILM_PACK=%s\nCOMMIT=%s\n' "$PY" "$ARCH" "$GLIBC" "$MINILM_PACK" "$commit" > "$OUT/packed.txt"
echo "pack.sh: $OUT ($(du -sh "$OUT" | cut -f1)) for Python $PY on $ARCH: $(echo $pins | tr '\n' ' ')"
echo "pack.sh: copy the checkout to the node with this folder in its root; there: bash $(basename "$OUT")/install.sh"
