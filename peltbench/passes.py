"""The one memo of peltbench's checks: inside `one_pass()` (a pass over many runs or records: a sweep's check of its
runs, peltbench-missing, the tables' reading), `once(question, value)` works out question(value) once per distinct
value and gives that answer whenever an equal value is asked again in the pass; outside a pass it asks every time.

This is how 100,000 runs are checked at the cost of a few hundred: a sweep's runs share the nodes of their configs
(the task, the method at each learning rate, train, the protocol, the objective: peltbench.missing composes them as
plain.Plain, and a record's config is read alike), so config.check_config asks each check of one node through
`once` (check_task, check_method, check_schedule, a node's settings, its keys, ...) and checks for each run only what
relates its nodes (k against the protocol, halving against fuse and train, the method against the model's
config.json). What a run asks of the file system about its model (its real path, its config.json) is keyed by its
name alike, and so taken as it was when first asked in the pass. Every pass asks afresh: a user's component or task
file changed since the last command (or test) is checked as it is now.

Values are told apart by type and value (1, 1.0 and True apart; a float by its repr: 0.0 and -0.0 apart), a Plain
node by its repr (worked out once per node: a Plain is never changed once made), a tuple by equality (of texts: a key
structure; a name and a flag). Anything else (a DictConfig, a dict or a list, which may change) is asked every time.
An answer is kept, None too; a question that raises is asked again next time. `question` is the function asked (answer = question(value)), or a name where the
answer is worked out by `answer` (then a function of the value alone)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable

from .plain import Plain

_answers: dict | None = None  # (question, the value's key) -> answer, inside one_pass()
_spelt: dict[int, str] = {}  # id(node) -> its repr, for the Plain nodes in _held: inside one_pass()
_held: list[Plain] = []  # held, so that their ids stay theirs
_BY_EQUALITY = frozenset((str, int, bool, type(None), tuple))  # told apart by type and equality (a float: by repr)


@contextmanager
def one_pass():
    """A pass over many records or runs: inside it, `once` answers each question once per distinct value (a pass
    inside a pass shares its answers)."""
    global _answers
    outer, _answers = _answers, {} if _answers is None else _answers
    try:
        yield
    finally:
        _answers = outer
        if outer is None:
            _forget_nodes()


def once(question: Any, value: Any, answer: Callable | None = None) -> Any:
    """question(value) (or answer(value)), asked once per (question, distinct value) inside one_pass(); every time
    outside it, and every time for a value that may change (module docstring)."""
    answers = _answers
    if answers is None:
        return (answer or question)(value)
    kind = type(value)
    if kind is Plain:
        try:  # (a subscript: a sweep asks ~40 times a run, nearly always a node seen before)
            key = question, _spelt[id(value)]
        except KeyError:
            key = question, _spell(value)
    elif kind in _BY_EQUALITY:
        key = question, kind, value
    elif kind is float:
        key = question, repr(value)  # 0.0 and -0.0 apart
    else:
        return (answer or question)(value)
    try:
        return answers[key]
    except KeyError:
        pass  # asked outside the handler: a refusal raised by the question is not "during" a KeyError
    found = answers[key] = (answer or question)(value)
    return found


def _spell(node: Plain) -> str:
    if len(_held) >= 4096:  # nodes of one run each (a record's own) come once: their texts keep their answers
        _forget_nodes()
    text = _spelt[id(node)] = repr(node)
    _held.append(node)
    return text


def _forget_nodes() -> None:
    _spelt.clear()
    _held.clear()
