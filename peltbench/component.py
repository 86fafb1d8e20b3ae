"""What peltbench knows about a component, declared once beside its code: the vocabulary of those declarations and
the one reader every component goes through, built-in or a user's (docs/components.md).

A component module (peltbench/methods/lora.py, or a user's mylab/lokr.py) holds one top-level assignment

    COMPONENT = Component(stage="projection", settings={"lora_rank": Setting(POSITIVE_INT, "LoRA rank r"), ...}, ...)

written with the names of this module only (and literal constants of its own module). A component module imports
torch; its declaration is read without running it: `declaration(name)` finds the module's file without importing
it or its package (importlib's finders, as `import` would find it), parses it (ast) and evaluates that one
expression against this module's names. So the config is checked before torch loads (peltbench.config), and when
the module runs it makes the same object itself. A component's name is its import path (`mylab.lokr`); the
built-ins', in peltbench.methods, keep their short names (`lora`).

Only the standard library is imported here: the declarations are read by the first check of a run's config.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import NamedTuple

from . import UserError

BUILTIN_PACKAGE = "peltbench.methods"
# Where a component sits among the others, the order they are attached in (each wraps what the earlier ones put at
# its place): the backbone's own tensors, modules beside the frozen path, deltas on a layer's Linears, transforms of
# a projection's input, scales of whatever sits at a projection, the model's input.
STAGES = ("backbone", "affine", "module", "projection", "rotation", "scale", "input")
PROJECTION_NAMES = ("query", "key", "value")  # the attention projections (architectures.projections)
LAYER_LINEARS = (*PROJECTION_NAMES, "attention_output", "intermediate", "output")  # every Linear of a layer


class ComponentError(UserError):
    """A component that cannot be found, or whose declaration cannot be read: one line naming it."""


# ---------------------------------------------------------------- rules: what a setting's value must be

class Rule(NamedTuple):
    """Whether a value is valid, and what it must be. Two rules are equal when they say the same (`must`): the one a
    declaration read from source makes and the one its module makes when it runs are two functions."""
    valid: Callable[[object], bool]
    must: str  # what the value must be, as the refusal says it: "must be a positive integer"

    def __eq__(self, other) -> bool:
        return isinstance(other, Rule) and self.must == other.must

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.must)


def rule(valid: Callable[[object], bool], must: str) -> Rule:
    """A rule of the component's own: `rule(lambda value: ..., "must be ...")`."""
    return Rule(valid, must)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value) -> bool:
    return is_int(value) and value > 0


def non_negative_int(value) -> bool:
    return is_int(value) and value >= 0


def positive_number(value) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value) and value > 0


def fraction(value) -> bool:
    return (is_int(value) or isinstance(value, float)) and 0 <= value < 1


def open_unit(value) -> bool:
    return isinstance(value, float) and 0 < value < 1


def text(value) -> bool:
    return isinstance(value, str) and value.strip() != ""


def boolean(value) -> bool:
    return isinstance(value, bool)


def distinct_list(value) -> bool:
    """A list (or OmegaConf's ListConfig) without repeats."""
    listed = isinstance(value, list) or type(value).__name__ == "ListConfig"
    return listed and len(set(map(str, value))) == len(value)


def choice(*values, must: str | None = None) -> Rule:
    """One of `values` (true and false are not 1 and 0)."""
    flags = any(isinstance(v, bool) for v in values)
    shown = ", ".join(map(str, values[:-1])) + f" or {values[-1]}" if len(values) > 1 else str(values[0])
    return Rule(lambda v: (flags or not isinstance(v, bool)) and v in values, must or f"must be {shown}")


def distinct(allowed: tuple, what: str, example: str = "") -> Rule:
    """A non-empty list of distinct names from `allowed` (`what` they are: "projections")."""
    return Rule(lambda v: distinct_list(v) and 0 < len(v) and set(v) <= set(allowed),
                f"must be a list of distinct {what} from {', '.join(allowed)}{f', e.g. {example}' if example else ''}")


POSITIVE_INT = Rule(positive_int, "must be a positive integer")
NON_NEGATIVE_INT = Rule(non_negative_int, "must be a non-negative integer")
POSITIVE_NUMBER = Rule(positive_number, "must be a positive number")
NON_NEGATIVE_NUMBER = Rule(lambda v: positive_number(v) or v == 0, "must be a number at least 0")
FRACTION = Rule(fraction, "must be a fraction of the run's steps, at least 0 and below 1")
OPEN_UNIT = Rule(open_unit, "must lie strictly between 0 and 1")
BOOL = Rule(boolean, "must be true or false")
TEXT = Rule(text, "must be a name")
PROJECTIONS = distinct(PROJECTION_NAMES, "projections", "[query,value]")
LINEARS = distinct(LAYER_LINEARS, "Linears of a layer")


# ---------------------------------------------------------------- the declaration

class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()  # Setting.default of a setting every method file must give


@dataclass(frozen=True)
class Setting:
    """A method setting a component reads (`method.KEY`): its rule, one help line (peltbench --help), and, where a
    method file may leave it out, the value that means (`default`). `read_if`: an expression of the method's
    settings under which it is read at all (prefix_hidden: "prefix_projection"), `unread` why not, where it is not."""
    rule: Rule
    help: str
    default: object = REQUIRED
    read_if: str | None = None
    unread: str = ""

    @property
    def optional(self) -> bool:
        """Whether a method file may leave it out (its `default` is then meant)."""
        return self.default is not REQUIRED

    def agrees(self, other: Setting) -> bool:
        """Two components may read one setting (lora and dora: lora_rank) when they mean the same by it."""
        return (self.rule.must, self.default, self.read_if) == (other.rule.must, other.default, other.read_if)


@dataclass(frozen=True)
class Check:
    """A condition on a method's settings together (`holds`, a Python expression of them), and, where it does not
    hold, the refusal (`why`, an f-string of the same names)."""
    holds: str
    why: str


@dataclass(frozen=True)
class Fit:
    """What the component needs of each Linear it adapts, from the model's config.json (before torch) and from the
    model itself (when built): `holds`, an expression of the method's settings and the Linear's `in_features`,
    `out_features` and `target` (its name among LAYER_LINEARS), for each target the setting `targets` lists (every
    projection where `targets` is None); `why` the refusal, an f-string of the same names. `sides`: which sizes it
    reads ("in", "out" or "both"), so the refusal names what in config.json gives them."""
    holds: str
    why: str
    targets: str | None = None
    sides: str = "both"

    def refusal(self, names: Mapping) -> str | None:
        """The refusal where the Linear of `names` (the settings, in_features, out_features, target) does not fit."""
        return None if evaluate(self.holds, names) else evaluate(f"f{self.why!r}", names)


@dataclass(frozen=True)
class Positions:
    """Positions the component puts before a row's text (prompt tuning's prompts): the setting that counts them,
    an expression under which it does (`when`), and how the refusal names them (`note`)."""
    count: str
    when: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Peft:
    """The PEFT method a run of this component alone (ungated) is exported as (saving.py): PEFT's `peft_type`, and
    what its config says beside the settings (DoRA: use_dora). A module that writes its own export defines
    `peft_export(tensors, method, arch)`; one that can refuse it for a run defines `peft_refusal(method, arch)`."""
    type: str
    config: Mapping = field(default_factory=dict)


def rank_fit(key: str, targets: str) -> Fit:
    """A low-rank update's rank `key` on each Linear `targets` lists: an update B·A of rank r on an out × in matrix
    has rank at most min(in, out), so a larger r only adds parameters (PiSSA and OLoRA cannot even take r vectors)."""
    width = "min(in_features, out_features)"
    return Fit(holds=f"{key} <= {width}", targets=targets,
               why=f"{key}={{{key}}} is above the adapted {{target}}'s width: its {{out_features}} × {{in_features}} "
                   f"weight has rank at most {{{width}}}, so a larger update only adds parameters; set "
                   f"method.{key}={{{width}}} or lower")


GATED = Setting(BOOL, "UniPELT's gate on each submodule (§3.2): true or false")
GATE_POOLING = Setting(choice("masked", "padded"), "gate mean over real tokens (masked) or over all max_length positions "
                       "as the authors' code (padded)", default="masked")


@dataclass(frozen=True)
class Component:
    """Everything peltbench knows about a component beside its code (docs/components.md).

    stage, after: where it is attached among the others (STAGES; within a stage after the components it names).
    settings: the method settings it reads. gate: what a gate multiplies in a gated method (`gated: true`), None if
    it has none; a component with a gate reads `gated` and `gate_pooling` too. excludes: components it cannot share
    a method with, and why. checks: conditions on its settings together. fits: what it needs of each Linear it
    adapts. positions: what it puts before the text. schedule: conditions on a run's planned optimiser `steps`.
    alone: why it never shares a backbone (its runs never fuse). group_by: settings a fused group's members share
    (0 for a member without the component). label, arxiv: its name in the tables, and its paper (its place there).
    peft: its PEFT export."""
    stage: str
    settings: Mapping[str, Setting] = field(default_factory=dict)
    after: tuple = ()
    gate: str | None = None
    excludes: Mapping[str, str] = field(default_factory=dict)
    checks: tuple = ()
    fits: tuple = ()
    positions: Positions | None = None
    schedule: tuple = ()
    alone: str | None = None
    group_by: tuple = ()
    label: str | None = None
    arxiv: str | None = None
    peft: Peft | None = None

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage={self.stage!r}: must be one of {', '.join(STAGES)}")

    def all_settings(self) -> dict[str, Setting]:
        """Its settings, with `gated` and `gate_pooling` where it has a gate."""
        return {**({"gated": GATED, "gate_pooling": GATE_POOLING} if self.gate else {}), **self.settings}

    def read(self, method: Mapping) -> set[str]:
        """The settings it reads in `method`: a `read_if` setting only where its condition holds."""
        return {key for key, setting in self.all_settings().items()
                if setting.read_if is None or evaluate(setting.read_if, self.values(method))}

    def values(self, method: Mapping, **more) -> dict:
        """The method's settings as plain values, with the defaults of the optional settings it leaves out."""
        plain = {key: value for key, value in _plain(method).items()}
        defaults = {key: setting.default for key, setting in self.all_settings().items() if setting.optional}
        return {**defaults, **plain, **more}

    def misfit(self, method: Mapping, **sizes) -> str | None:
        """Why the method's settings do not fit a Linear of these sizes (`in_features`, `out_features`, `target`),
        or None: the rule the config is checked with before torch (peltbench.config) and the module when it builds."""
        names = self.values(method, **sizes)
        for fit in self.fits:
            why = fit.refusal(names)
            if why:
                return why
        return None

    def refusals(self, method: Mapping, checks: tuple, **more) -> list[str]:
        """The refusals of `checks` (its `checks` or `schedule`) that do not hold for `method` (and `more` names)."""
        names = self.values(method, **more)
        return [evaluate(f"f{check.why!r}", names) for check in checks if not evaluate(check.holds, names)]


# ---------------------------------------------------------------- expressions in declarations

SAFE_BUILTINS = {name: getattr(builtins, name)
                 for name in ("abs", "all", "any", "bool", "float", "int", "isinstance", "len", "list", "max", "min",
                              "range", "round", "set", "sorted", "str", "sum", "tuple", "True", "False", "None")}


@lru_cache(maxsize=1024)
def _compiled(expression: str):
    return compile(expression, "<declaration>", "eval")


def evaluate(expression: str, names: Mapping):
    """A declaration's expression (a Check's `holds`, an f-string `why`) on the method's settings `names`."""
    return eval(_compiled(expression), {"__builtins__": SAFE_BUILTINS}, dict(names))  # noqa: S307 - the user's own code


def _plain(method: Mapping) -> dict:
    """A method config (DictConfig, or plain data) as plain values: lists as lists."""
    if hasattr(method, "_get_node"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(method, resolve=True)
    return dict(method)


# ---------------------------------------------------------------- reading declarations

def module_name(name: str) -> str:
    """The module a component name stands for: a built-in's short name in peltbench.methods, else its import path."""
    return f"{BUILTIN_PACKAGE}.{name}" if "." not in name else name


def is_builtin(name: str) -> bool:
    return "." not in name


def check_name(name) -> str | None:
    """Why `name` cannot name a component, or None."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        return f"{name!r} is not a component name (a built-in's name, or a module's import path: mylab.lokr)"
    if name.startswith(BUILTIN_PACKAGE + "."):
        short = name[len(BUILTIN_PACKAGE) + 1:]
        return f"{name} is the built-in component {short}: name it {short}"
    return None


def find_module(module: str) -> ModuleSpec | None:
    """The spec `import module` would find, found without running the module or the packages above it (a package's
    __init__ may import torch): each level's finders asked in turn, as importlib does, with the parent's path."""
    if module in sys.modules and getattr(sys.modules[module], "__spec__", None) is not None:
        return sys.modules[module].__spec__
    path = None
    spec = None
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__spec__", None) is not None:
            spec = loaded.__spec__
        else:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                try:
                    spec = find(name, path)
                except (ImportError, ValueError):
                    spec = None
                if spec is not None:
                    break
            if spec is None:
                return None
        if depth < len(parts):
            path = spec.submodule_search_locations
            if path is None:  # a module, not a package: nothing below it
                return None
            path = list(path)
    return spec


def source_of(name: str) -> tuple[str, str]:
    """(file, source) of component `name`'s module; ComponentError where there is none."""
    module = module_name(name)
    spec = find_module(module)
    if spec is None or not spec.origin or not spec.has_location:
        where = ("its module is not on this Python's path (pip install its package, or add the folder above it to "
                 "PYTHONPATH)") if not is_builtin(name) else f"peltbench has no component {name}"
        raise ComponentError(f"component {name}: {where}")
    try:
        return spec.origin, Path(spec.origin).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ComponentError(f"component {name}: cannot read {spec.origin} ({error})") from None


@lru_cache(maxsize=None)
def declaration(name: str) -> Component:
    """Component `name`'s declaration, read from its module's source without running it (cached per process: a
    sweep checks thousands of runs). ComponentError, in one line, for a module that is not there or declares none."""
    why = check_name(name)
    if why:
        raise ComponentError(why)
    origin, source = source_of(name)
    return read_declaration(source, origin, name)


def read_declaration(source: str, origin: str, name: str) -> Component:
    """`COMPONENT = Component(...)` in `source`, evaluated with this module's names and the module's own literal
    top-level constants it names (`NAME = "..."`, numbers, tuples of them). Only those statements are parsed (a
    whole module's parse costs ten times as much)."""
    found = _top_level_value(source, "COMPONENT", origin, name)
    if found is None:
        raise ComponentError(f"component {name}: {origin} declares no COMPONENT = Component(...) (docs/components.md)")
    names = {node.id for node in ast.walk(found) if isinstance(node, ast.Name)}
    local = {node.id for node in ast.walk(found) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    local |= {arg.arg for node in ast.walk(found) if isinstance(node, ast.Lambda) for arg in node.args.args}
    vocabulary = _vocabulary()
    constants = {}
    for key in sorted(names - set(vocabulary) - local - set(SAFE_BUILTINS)):
        value = _top_level_value(source, key, origin, name)
        try:
            constants[key] = ast.literal_eval(value) if value is not None else None
        except (ValueError, TypeError, SyntaxError, RecursionError):
            value = None
        if value is None:
            raise ComponentError(f"component {name}: its COMPONENT names {key}, which is neither peltbench.component's "
                                 f"nor a literal constant of {origin} (docs/components.md)")
    namespace = {**vocabulary, **constants, "__builtins__": SAFE_BUILTINS}
    try:
        made = eval(compile(ast.Expression(found), origin, "eval"), namespace)  # noqa: S307 - the user's own code
    except Exception as error:
        raise ComponentError(f"component {name}: its COMPONENT cannot be made: {type(error).__name__}: {error}") from None
    if not isinstance(made, Component):
        raise ComponentError(f"component {name}: COMPONENT in {origin} is a {type(made).__name__}, not a Component")
    return made


def _top_level_value(source: str, target: str, origin: str, name: str) -> ast.expr | None:
    """The value of the last top-level `target = ...` in `source` (its statement found by its tokens and parsed
    alone), or None."""
    import io
    import tokenize

    starts = [match.start() for match in re.finditer(rf"^{re.escape(target)}\s*(:[^=\n]*)?=(?!=)", source, re.M)]
    if not starts:
        return None
    line = source.count("\n", 0, starts[-1]) + 1
    rest = source[starts[-1]:]
    depth, end = 0, len(rest)
    try:
        for token in tokenize.generate_tokens(io.StringIO(rest).readline):
            if token.type == tokenize.OP and token.string in "([{":
                depth += 1
            elif token.type == tokenize.OP and token.string in ")]}":
                depth -= 1
            elif token.type in (tokenize.NEWLINE, tokenize.ENDMARKER) and depth == 0:
                end = _offset(rest, token.start)
                break
        tree = ast.parse(rest[:end])
    except (SyntaxError, tokenize.TokenError) as error:
        raise ComponentError(f"component {name}: {origin} line {line}: its {target} cannot be read "
                             f"({getattr(error, 'msg', None) or error})") from None
    node = tree.body[0] if tree.body else None
    return node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None


def _offset(text: str, position: tuple[int, int]) -> int:
    """The character offset of a tokenize (row, column) in `text`."""
    row, column = position
    offset = 0
    for _ in range(row - 1):
        offset = text.index("\n", offset) + 1
    return offset + column


def setting_of(component: str, key: str) -> Setting:
    """The setting `key` as component `component` declares it: a component that reads another's setting (DoRA reads
    LoRA's lora_rank) names it so, and the two agree by construction."""
    return declaration(component).all_settings()[key]


def _vocabulary() -> dict:
    module = sys.modules[__name__]
    return {name: getattr(module, name) for name in __all__}


# ---------------------------------------------------------------- the built-ins and the order of components

@lru_cache(maxsize=None)
def builtin_files() -> frozenset[str]:
    """The built-in components' names: the modules of peltbench.methods that declare a COMPONENT (found, not run)."""
    spec = find_module(BUILTIN_PACKAGE)
    return frozenset(path.stem for folder in spec.submodule_search_locations or ()
                     for path in Path(folder).glob("*.py")
                     if re.search(r"^COMPONENT\s*=", path.read_text(encoding="utf-8"), re.M))


@lru_cache(maxsize=None)
def builtin_names() -> tuple[str, ...]:
    """The built-in components in the order they attach (install_order)."""
    return tuple(install_order(builtin_files()))


def install_order(names) -> list[str]:
    """`names` in the order they are attached: by stage (STAGES), within a stage after the components each names in
    `after` (those present), ties by name; a cycle of `after` is a ComponentError."""
    names = list(dict.fromkeys(names))
    declared = {name: declaration(name) for name in names}
    ordered: list[str] = []
    for stage in STAGES:
        todo = sorted(name for name in names if declared[name].stage == stage)
        while todo:
            ready = [name for name in todo if not any(before in todo for before in declared[name].after)]
            if not ready:
                raise ComponentError(f"components {', '.join(todo)}: their `after` lists name each other in a cycle")
            ordered.append(ready[0])
            todo.remove(ready[0])
    return ordered


# ---------------------------------------------------------------- the identity of a user's code

NOT_FOUND = "not found on this Python path"
# How a record names the rule its code's hash was made by: `code` (what the code means: its syntax trees without
# docstrings), or `source` (the files' bytes of the module and what it imports, not the packages above it: records
# made before the code's meaning was hashed, read by that rule still: code_identity_as).
CODE_RULE, SOURCE_RULE = "code", "source"
_BY_SOURCE_RULE = re.compile(rf"(version \S+, )?{SOURCE_RULE} [0-9a-f]{{16}}")


@lru_cache(maxsize=None)
def code_identity(name: str) -> str:
    """Which code a user's component is (record.semantic_config puts it in the identity of the runs that use it):
    its package's version where it has one, and `code <hash>`: a hash of what every module that `import name` runs
    means (the packages' __init__ on its path and every module of its own top-level package they and it import,
    transitively, as their `import` statements name them), each as its syntax tree without docstrings (`_meaning`):
    a comment, a docstring or a change of layout alone is the same code. Read once per process. NOT_FOUND where
    the module is not there."""
    return _identity(name, CODE_RULE)


@lru_cache(maxsize=None)
def source_identity(name: str) -> str:
    """The identity of component `name`'s code by the rule records were made with before `code_identity` (`source
    <hash>`): the bytes of its module and of the modules of its package it imports, the packages above it left out."""
    return _identity(name, SOURCE_RULE)


def code_identity_as(name: str, recorded) -> str:
    """The identity of component `name`'s code as this process finds it, by the rule `recorded` (what a record
    stored for it) was made by: a record made by the `source` rule is the run of today's code where that rule's hash
    of today's code is the one it stored (docs/record.md, "The identity of a user's code")."""
    if isinstance(recorded, str) and _BY_SOURCE_RULE.fullmatch(recorded):
        return source_identity(name)
    return code_identity(name)


def _identity(name: str, rule: str) -> str:
    try:
        origin, _ = source_of(name)
    except ComponentError:
        return NOT_FOUND
    by_meaning = rule == CODE_RULE
    digest = hashlib.sha256()
    for module, path in sorted(_package_closure(name, origin, by_meaning).items()):
        text = _meaning(path) if by_meaning else Path(path).read_bytes()
        digest.update(module.encode() + b"\0" + text + b"\0")
    version = _version(name.split(".")[0])
    return f"{f'version {version}, ' if version else ''}{rule} {digest.hexdigest()[:16]}"


def _package_closure(module: str, origin: str, packages: bool = True) -> dict[str, str]:
    """{module: file} of `module` and the modules of its top-level package it imports, transitively; with `packages`,
    also each package above every one of them (`import mylab.sub.loha` runs mylab/__init__.py and
    mylab/sub/__init__.py first), and what those import."""
    top = module.split(".")[0]
    found, todo = {module: origin}, [(module, origin)]
    for name in _packages_above(module) if packages else ():
        _add(name, found, todo)
    while todo:
        current, path = todo.pop()
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        package = current if path.endswith("__init__.py") else current.rpartition(".")[0]
        for node in ast.walk(tree):
            for imported in _imports(node, package):
                for name in (*_packages_above(imported), imported) if packages else (imported,):
                    if name.split(".")[0] == top and name not in found:
                        _add(name, found, todo)
    return found


def _packages_above(module: str) -> list[str]:
    """`a.b.c` -> [a, a.b]: the packages `import a.b.c` runs before it."""
    parts = module.split(".")
    return [".".join(parts[:depth]) for depth in range(1, len(parts))]


def _add(module: str, found: dict[str, str], todo: list) -> None:
    """Put `module`'s file in `found` and `todo`, where it is a Python file (not a namespace package, not compiled)."""
    spec = find_module(module)
    if spec is not None and spec.has_location and spec.origin and spec.origin.endswith(".py"):
        found[module] = spec.origin
        todo.append((module, spec.origin))


def _meaning(path: str) -> bytes:
    """What the module at `path` computes, as text: its syntax tree (ast) without positions, comments, layout
    (spaces, line breaks, parentheses, quotes), docstrings and other bare string statements (they compute nothing),
    fields Python leaves empty (so a Python that adds one reads the same text), nor `type_comment`, `kind`. A file
    that does not parse (it cannot be imported either) as its bytes."""
    source = Path(path).read_bytes()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return b"unparsed\0" + source
    return repr(_tree(tree)).encode()


_NOT_MEANING = frozenset({"type_comment", "kind"})  # a comment's annotation; a string's `u` prefix


def _tree(node):
    """`node` as nested tuples of its type's name and its (field, value) pairs that carry meaning (`_meaning`)."""
    if isinstance(node, ast.AST):
        fields = [type(node).__name__]
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                value = [item for item in value if not _bare_string(item)]
            if field not in _NOT_MEANING and value is not None and value != []:
                fields.append((field, _tree(value)))
        return tuple(fields)
    if isinstance(node, list):
        return tuple(_tree(item) for item in node)
    return node


def _bare_string(node) -> bool:
    """A statement that is a string alone: a docstring, or a string used as a comment."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _imports(node: ast.AST, package: str) -> list[str]:
    """The modules an import statement names (`from . import x`: package.x as well as the package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(base + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _version(top: str) -> str | None:
    """The version of the installed distribution that provides top-level package `top`, or None."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in _distributions().get(top, ()):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


@lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()


__all__ = ["BOOL", "Check", "Component", "FRACTION", "Fit", "GATED", "GATE_POOLING", "LAYER_LINEARS", "LINEARS",
           "NON_NEGATIVE_INT", "NON_NEGATIVE_NUMBER", "OPEN_UNIT", "POSITIVE_INT", "POSITIVE_NUMBER", "PROJECTIONS",
           "PROJECTION_NAMES", "Peft", "Positions", "REQUIRED", "Rule", "STAGES", "Setting", "TEXT", "boolean",
           "choice", "distinct", "distinct_list", "fraction", "is_int", "non_negative_int", "open_unit",
           "positive_int", "positive_number", "rank_fit", "rule", "setting_of", "text"]
