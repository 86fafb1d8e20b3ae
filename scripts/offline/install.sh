#!/usr/bin/env bash
# On the offline GPU node, in the checkout's root, with .offline/ from make pack-offline: bash .offline/install.sh
# Makes .venv over the node's python3 (PYTHON= another; VENV= another folder): the node's torch, transformers and the
# rest stay where they are, seen behind the venv's own packages (a .pth adds the node's site directories); the carried
# wheels go into the venv, so they win where both exist; peltbench installs editable; then MiniLM, and a check that
# torch is the node's, every requirement holds, hydra and peltbench import and MiniLM loads.
# Any failure ends with one line naming the step that failed, and exit status 1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here"); cd "$root"
PYTHON=${PYTHON:-python3} VENV=${VENV:-.venv}
step="reading $here/packed.txt"; said=
fail() { echo "install.sh: $*" >&2; said=1; exit 1; }
trap 'status=$?; [[ $status == 0 || -n $said ]] || echo "install.sh: FAILED while $step (the lines above say why): $VENV is incomplete" >&2' EXIT
# shellcheck source=/dev/null
source "$here/packed.txt"

step="checking $PYTHON"
command -v "$PYTHON" >/dev/null || fail "no $PYTHON here: PYTHON=/path/to/the/node's/python3"
have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $have == "$PY" ]] || fail "the carried wheels are for Python $PY and $PYTHON is $have: pack again with PY=$have"
[[ $(uname -m) == "$ARCH" ]] || fail "the carried wheels are for $ARCH and this machine is $(uname -m): pack again with ARCH=$(uname -m)"
"$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" \
  || fail "$PYTHON has no torch: this installs over the node's own torch (a CUDA build; install one there first)"

step="making $VENV"
if [[ -e $VENV ]]; then
  [[ -f $VENV/.peltbench-offline ]] || fail "$VENV exists and install.sh did not make it: remove it (or VENV=another)"
  rm -rf "$VENV"
fi
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
step="installing pip into $VENV"
pip_wheel=$(ls "$here"/tools/pip-*.whl)
"$py" "$pip_wheel/pip" install -q --no-index --ignore-installed --no-warn-script-location --no-compile "$pip_wheel"
step="installing the carried wheels"
shopt -s nullglob; wheels=("$here"/wheels/*.whl); shopt -u nullglob   # none where the node lacked nothing (NODE=)
[[ ${#wheels[@]} == 0 ]] || "$py" -m pip install -q --no-index --no-deps --ignore-installed --no-warn-conflicts "${wheels[@]}"
step="installing peltbench (editable; setuptools and wheel from $here/tools)"
# -qq: setuptools' warnings on the build's own output would bury the rest; its errors still show
"$py" -m pip install -qq --no-index --find-links "$here/tools" --no-deps --ignore-installed --no-warn-conflicts -e "$root"
if [[ -d $here/minilm ]]; then
  step="installing MiniLM"
  "$py" "$here/offline.py" minilm-unpack "$here/minilm"
fi
step="checking the install"
HF_HUB_OFFLINE=1 "$py" "$here/offline.py" check "$here"
echo "install.sh: ok: source $VENV/bin/activate, and HF_HUB_OFFLINE=1 for runs (make check-gpu checks a GPU)"
