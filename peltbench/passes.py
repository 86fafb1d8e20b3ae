"""One pass over many runs or records (the tables' reading, a sweep's check of its runs): inside `one_pass()`, what a
run asks of the file system about its model (its real path, its config.json) is looked up once per model name, not
once per run, and taken as it was when first asked."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

_answers: dict | None = None  # (what, key) -> answer, inside one_pass()


@contextmanager
def one_pass():
    """A pass over many records or runs: inside it, `once` answers each question once."""
    global _answers
    outer, _answers = _answers, {} if _answers is None else _answers
    try:
        yield
    finally:
        _answers = outer


def once(what: str, key, answer: Callable):
    """answer(key), asked once per (what, key) inside one_pass(); every time outside it."""
    if _answers is None:
        return answer(key)
    found = _answers.get((what, key), _answers)
    if found is _answers:
        found = _answers[what, key] = answer(key)
    return found
