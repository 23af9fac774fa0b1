"""Shared pieces of the config tree: the strict base model and the bounded field types.

A field whose only rule is a common bound takes one of the types below instead of a validator of its own:

    max_concurrent: AtLeastOne = 32
    port: Port = 0

A type's message states the bound and the value given; the loader prefixes it with the source and the
field (`gyre.yaml: packer.j_max: must be at least 1; got 0`), so the one-line error names the field and
the fix. These are Gyre's own types, not pydantic's constrained types of similar names: their messages
follow that format, and a NaN fails `PositiveFloat` but passes `NonNegativeFloat`, as the comparisons read.
A bound that belongs to one field (a range with a reason of its own, a rule across fields) stays a
validator on its section, next to the field it explains.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict

_Number = TypeVar("_Number", int, float)


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, docstrings document fields."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


def _at_least_one(v: int) -> int:
    if v < 1:
        raise ValueError(f"must be at least 1; got {v}")
    return v


def _at_least_one_or_null(v: int | None) -> int | None:
    if v is not None and v < 1:
        raise ValueError(f"must be at least 1, or null; got {v}")
    return v


def _non_negative(v: _Number) -> _Number:
    if v < 0:
        raise ValueError(f"must be >= 0; got {v}")
    return v


def _positive(v: float) -> float:
    if not v > 0:
        raise ValueError(f"must be > 0; got {v}")
    return v


def _port(v: int) -> int:
    if not 0 <= v <= 65535:
        raise ValueError(f"must be a port in 0..65535 (0 = pick a free one); got {v}")
    return v


AtLeastOne = Annotated[int, AfterValidator(_at_least_one)]
"""A count or size of at least 1."""
AtLeastOneOrNull = Annotated[int | None, AfterValidator(_at_least_one_or_null)]
"""A limit of at least 1, or None (YAML null) for the meaning the field documents (unlimited, a default)."""
NonNegativeInt = Annotated[int, AfterValidator(_non_negative)]
"""A count where 0 is meaningful (none, off)."""
NonNegativeFloat = Annotated[float, AfterValidator(_non_negative)]
"""A duration, weight or bound where 0 is meaningful (no wait, off)."""
PositiveFloat = Annotated[float, AfterValidator(_positive)]
"""A duration or rate that must be above 0 (a timeout, a period, a learning rate)."""
Port = Annotated[int, AfterValidator(_port)]
"""A TCP port; 0 lets the listener pick a free one."""
