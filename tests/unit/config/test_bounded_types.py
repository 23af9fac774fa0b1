"""The bounded field types of `gyre.config.base`: each accepts exactly its range, its message states the
bound and the value, and a section that redeclares a field (to change its default) keeps the bound."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import gyre.config  # noqa: F401  (imports every section module, so `Section.__subclasses__` sees them all)
from gyre.config.base import (
    AtLeastOne,
    AtLeastOneOrNull,
    NonNegativeFloat,
    NonNegativeInt,
    Port,
    PositiveFloat,
    Section,
)


class _Bounded(Section):
    at_least_one: AtLeastOne = 1
    """A count."""
    at_least_one_or_null: AtLeastOneOrNull = None
    """A limit, or None."""
    non_negative_int: NonNegativeInt = 0
    """A count where 0 means none."""
    non_negative_float: NonNegativeFloat = 0.0
    """A delay where 0 means none."""
    positive_float: PositiveFloat = 1.0
    """A timeout."""
    port: Port = 0
    """A port."""


def _accepts(field: str, value: object) -> bool:
    try:
        _Bounded.model_validate({field: value})
    except ValidationError:
        return False
    return True


@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_integer_types_accept_exactly_their_range(v: int) -> None:
    assert _accepts("at_least_one", v) == (v >= 1)
    assert _accepts("at_least_one_or_null", v) == (v >= 1)
    assert _accepts("non_negative_int", v) == (v >= 0)
    assert _accepts("port", v) == (0 <= v <= 65535)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_float_types_accept_exactly_their_range(v: float) -> None:
    assert _accepts("non_negative_float", v) == (not v < 0)
    assert _accepts("positive_float", v) == (v > 0)


def test_null_only_where_the_type_allows_it() -> None:
    assert _accepts("at_least_one_or_null", None)
    assert not _accepts("at_least_one", None)
    assert not _accepts("port", None)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("at_least_one", 0, "must be at least 1; got 0"),
        ("at_least_one_or_null", -3, "must be at least 1, or null; got -3"),
        ("non_negative_int", -1, "must be >= 0; got -1"),
        ("non_negative_float", -0.5, "must be >= 0; got -0.5"),
        ("positive_float", 0, "must be > 0; got 0.0"),
        ("port", 70000, "must be a port in 0..65535 (0 = pick a free one); got 70000"),
    ],
)
def test_message_states_the_bound_and_the_value(field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        _Bounded.model_validate({field: value})
    (error,) = info.value.errors()
    assert error["loc"] == (field,)
    assert error["msg"] == f"Value error, {message}"


def test_assignment_is_checked_too() -> None:
    bounded = _Bounded()
    with pytest.raises(ValidationError, match=r"0\.\.65535"):
        bounded.port = 70000
    assert bounded.port == 0


def _sections(cls: type[Section]) -> list[type[Section]]:
    out: list[type[Section]] = []
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("gyre.config"):
            out.append(sub)
        out += _sections(sub)
    return out


def test_redeclared_fields_keep_their_bound() -> None:
    checked = 0
    for sub in _sections(Section):
        for parent in sub.__mro__[1:]:
            if not (isinstance(parent, type) and issubclass(parent, Section)) or parent is Section:
                continue
            for name in sub.__annotations__:
                if name in parent.model_fields:
                    mine, theirs = sub.model_fields[name], parent.model_fields[name]
                    assert (mine.annotation, mine.metadata) == (theirs.annotation, theirs.metadata), (
                        f"{sub.__name__}.{name} redeclares {parent.__name__}.{name} with another type or bound"
                    )
                    checked += 1
    assert checked >= 3
