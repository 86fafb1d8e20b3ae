"""A plain setting of a swept config group in a sweep: `peltbench -m method=adapter,lora method.lr=1e-3`.

Hydra composes a sweep's own config before it splits the sweep into jobs, and in that config a group that is swept
(`method=adapter,lora`, or a group an `+experiment` file sweeps) has no value yet (conf/config.yaml: `method: null`),
so a plain `method.lr=1e-3` has nothing to set and Hydra refuses it ("no such setting"), while a value list
(`method.lr=1e-3,3e-4`) is a sweep and waits for the jobs. `pin_group_settings` writes the plain value as a sweep of
one value, `method.lr=choice(1e-3)`: Hydra then applies it in each job, after the job's method is composed, and the
jobs are the same ones, in the same order, as with a value list of one.
"""

from __future__ import annotations

GROUPS = ("method", "task", "objective", "logger")  # config groups whose settings (GROUP.KEY=VALUE) a sweep may set


def pin_group_settings(arguments: list[str]) -> list[str]:
    """`arguments` with each plain GROUP.KEY=VALUE of a group that no plain GROUP=NAME fixes rewritten as
    GROUP.KEY=choice(VALUE); unchanged outside a sweep (-m, --multirun, hydra.mode=MULTIRUN)."""
    if not any(arg in ("-m", "--multirun", "hydra.mode=MULTIRUN") for arg in arguments):
        return list(arguments)
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = {}
    for index, argument in enumerate(arguments):
        if not argument.startswith("-") and "=" in argument:
            try:
                parsed[index] = parser.parse_override(argument)
            except HydraException:  # preflight names a bad override; leave it as given
                pass
    fixed = {o.key_or_group for o in parsed.values() if o.key_or_group in GROUPS and not o.is_sweep_override()}
    result = list(arguments)
    for index, override in parsed.items():
        group, dot, _ = override.key_or_group.partition(".")
        key, _, value = arguments[index].partition("=")
        if (dot and group in GROUPS and group not in fixed and override.type == OverrideType.CHANGE
                and override.package is None and not override.is_sweep_override() and value.strip()):
            result[index] = f"{key}=choice({value})"
    return result


def as_given(arguments: list[str]) -> list[str]:
    """The arguments as a user types them: GROUP.KEY=choice(VALUE) of one value back to GROUP.KEY=VALUE (the same
    sweep; `pin_group_settings` undone, for the commands a sweep's summary prints)."""
    result = []
    for argument in arguments:
        key, equals, value = argument.partition("=")
        one = equals and key.partition(".")[0] in GROUPS and value.startswith("choice(") and value.endswith(")")
        inner = value[len("choice("):-1] if one else ""
        result.append(f"{key}={inner}" if one and inner and not _several(inner) else argument)
    return result


def _several(inner: str) -> bool:
    """Whether a choice(...) body lists more than one value (a comma outside brackets and quotes)."""
    depth, quote = 0, None
    for char in inner:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return False
