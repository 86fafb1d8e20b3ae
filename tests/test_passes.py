"""peltbench.passes, the one memo of the checks: inside a pass each question is asked once per distinct value (a
Plain node by its value, equal copies alike; values apart by type and repr), outside it every time; every pass asks
afresh."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from peltbench.passes import once, one_pass
from peltbench.plain import Plain


def asking():
    """check(value) that records each value it was asked about; it raises for a negative lr, answers None for 0."""
    asked = []

    def check(value):
        asked.append(value)
        lr = value.get("lr", 1) if isinstance(value, dict) else value
        if lr < 0:
            raise ValueError("negative")
        return None if lr == 0 else "fine"

    return check, asked


def test_inside_a_pass_each_distinct_value_is_asked_once_equal_copies_alike():
    check, asked = asking()
    node, twin, zero = Plain(lr=1e-3), Plain(lr=1e-3), Plain(lr=0)
    with one_pass():
        assert [once(check, n) for n in (node, node, twin, zero, zero, 3, 3)] == \
            ["fine", "fine", "fine", None, None, "fine", "fine"]
    assert asked == [node, zero, 3] and asked[0] is node


def test_values_equal_in_python_are_apart_by_type_and_repr():
    """1, 1.0 and True; 0.0 and -0.0; '1' and 1: each asked on its own (a record and a check tell them apart)."""
    asked = []
    values = [1, 1.0, True, "1", 0.0, -0.0]
    with one_pass():
        for value in values + values:
            once(asked.append, value)
        for lr in values + values:
            once(asked.append, Plain(lr=lr))
    assert [repr(v) for v in asked[:6]] == [repr(v) for v in values]
    assert [repr(v["lr"]) for v in asked[6:]] == [repr(v) for v in values]


def test_what_may_change_is_asked_every_time():
    """A DictConfig, a dict or a list that is not a Plain may be changed between two askings."""
    asked = []
    changing = [{"lr": 1e-3}, OmegaConf.create({"lr": 1e-3}), [1]]
    with one_pass():
        for value in changing + changing:
            once(asked.append, value)
    assert len(asked) == 6


def test_outside_a_pass_every_asking_asks_and_each_pass_asks_afresh():
    check, asked = asking()
    node = Plain(lr=1e-3)
    once(check, node), once(check, node)
    with one_pass():
        once(check, node), once(check, node)
        with one_pass():  # a pass inside a pass shares its answers
            once(check, node)
    with one_pass():
        once(check, node)
    assert len(asked) == 4


def test_a_question_that_raises_is_asked_again_and_questions_are_apart():
    check, asked = asking()
    negative, node = Plain(lr=-1), Plain(lr=1e-3)
    with one_pass():
        for _ in range(2):
            with pytest.raises(ValueError) as raised:
                once(check, negative)
            assert raised.value.__context__ is None  # a refusal's traceback is its own
        assert once(check, node) == "fine" and once("another question", node, lambda _: 7) == 7
        assert once("another question", Plain(lr=1e-3), lambda _: 8) == 7  # a name and its answer: one meaning
    assert asked == [negative, negative, node]


def test_a_tuple_of_texts_is_its_own_key():
    asked = []
    with one_pass():
        for value in [("a", "b"), ("a", "b"), ("a", ("b",))]:
            once(asked.append, value)
    assert asked == [("a", "b"), ("a", ("b",))]
