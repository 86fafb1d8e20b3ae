#!/usr/bin/env bash
# On the offline GPU node, in the checkout's root, with .offline/ from make pack-offline: bash .offline/install.sh
# Makes .venv over the node's python3 (PYTHON= another; VENV= another folder): the node's torch stays where it is,
# seen behind the venv's own packages (a .pth adds the node's site directories); the carried wheels, everything
# peltbench needs but torch, go into the venv, so they win over the node's own transformers, peft and the rest;
# peltbench installs editable; then MiniLM, and a check that torch is the node's, hydra and peltbench import and
# MiniLM loads. Any failure ends with one line naming the step that failed, and exit status 1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here"); cd "$root"
PYTHON=${PYTHON:-python3} VENV=${VENV:-.venv}
step="reading $here/packed.txt"; said=
fail() { echo "install.sh: $*" >&2; said=1; exit 1; }
trap 'status=$?; [[ $status == 0 || -n $said ]] \
  || echo "install.sh: FAILED while $step (the lines above say why)${made:+: $VENV is incomplete}" >&2' EXIT
say() { echo "install.sh: $step"; }
# shellcheck source=/dev/null
source "$here/packed.txt"
shopt -s nullglob; pip_wheel=("$here"/tools/pip-*.whl); wheels=("$here"/wheels/*.whl); shopt -u nullglob
[[ ${#pip_wheel[@]} == 1 ]] || fail "$here/tools holds no pip wheel (or several): make pack-offline again"

step="checking $PYTHON (the node's Python and its torch)"; say
command -v "$PYTHON" >/dev/null || fail "no $PYTHON here: PYTHON=/path/to/the/node's/python3"
have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $have == "$PY" ]] || fail "the carried wheels are for Python $PY and $PYTHON is $have: pack again with PY=$have"
[[ $(uname -m) == "$ARCH" ]] \
  || fail "the carried wheels are for $ARCH and this machine is $(uname -m): pack again with ARCH=$(uname -m)"
glibc=$("$PYTHON" -c 'import platform; print(platform.libc_ver()[1])')
[[ -z $glibc ]] || printf '%s\n%s\n' "$GLIBC" "$glibc" | sort -C -V \
  || fail "the carried wheels may need glibc $GLIBC and this node has $glibc: pack again with GLIBC=$glibc"
# The node's torch against what the carried packages ask of it; pip's wheel on the path lends offline.py `packaging`.
PYTHONPATH=${pip_wheel[0]} "$PYTHON" "$here/offline.py" node "$here"

step="making $VENV"; say
if [[ -e $VENV ]]; then
  [[ -f $VENV/.peltbench-offline ]] || fail "$VENV exists and install.sh did not make it: remove it (or VENV=another)"
  rm -rf "$VENV"
fi
made=1
"$PYTHON" -m venv --without-pip "$VENV"
touch "$VENV/.peltbench-offline"   # ours: a later run may replace it
py=$VENV/bin/python
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# The node's site directories (user site included), read as site directories so their own .pth files count too.
"$PYTHON" -c "
import site
dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in dirs))" > "$site/_node_site.pth"

# --ignore-installed everywhere: pip sees the node's packages too, and must neither skip a carried one nor uninstall
# the node's. pip itself comes carried: the node's may be missing or too old for an editable install.
step="installing pip into $VENV"; say
"$py" "${pip_wheel[0]}/pip" install -q --no-index --ignore-installed --no-warn-script-location --no-compile \
  "${pip_wheel[0]}"
step="installing the carried wheels (${#wheels[@]})"; say
[[ ${#wheels[@]} == 0 ]] || "$py" -m pip install -q --no-index --no-deps --ignore-installed --no-warn-conflicts \
  --no-warn-script-location --no-compile "${wheels[@]}"
step="checking that every requirement of peltbench holds"; say
"$py" "$here/offline.py" requirements "$here"
if [[ -d $here/minilm ]]; then
  step="installing MiniLM"; say
  "$py" "$here/offline.py" minilm-unpack "$here"
fi
step="installing peltbench (editable; setuptools and wheel from $here/tools)"; say
# -qq: setuptools' warnings on the build's own output would bury the rest; its errors still show
"$py" -m pip install -qq --no-index --find-links "$here/tools" --no-deps --ignore-installed --no-warn-conflicts -e "$root"
step="checking the install"; say
HF_HUB_OFFLINE=1 "$py" "$here/offline.py" check "$here"
echo "install.sh: ok: source $VENV/bin/activate, and HF_HUB_OFFLINE=1 for runs (make check-gpu checks a GPU)"
