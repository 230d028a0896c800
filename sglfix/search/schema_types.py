"""What the scenario schema allows for one field, read from its pydantic type.

``sglfix search`` draws scenarios from the schema itself: an integer field's bounds are the ones
its ``bounded`` validator enforces, a name field's choices the ones its choice validator accepts,
a flag is a flag. Reading them here keeps the search space from restating the schema: a limit
raised in ``limits.py`` or a dtype added to ``models.py`` is a limit or a dtype the search draws.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import BaseModel

from sglfix.scenario import models

__all__ = ["FieldKind", "field_kind"]


@dataclass(frozen=True)
class FieldKind:
    """One field as the schema takes it: its integer bounds (of each item, for a per-request list),
    its choices, whether it is a flag, whether it may be left out (None), a power of two."""

    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()
    flag: bool = False
    optional: bool = False
    power_of_two: bool = False
    per_request: bool = False


def _validators(annotation: Any) -> list[Any]:
    """Every validator function in ``annotation``, outermost first, through Annotated, unions and
    tuples (a per-request list's items are validated by their own type)."""
    out: list[Any] = []
    meta = getattr(annotation, "__metadata__", ())
    for m in meta:
        func = getattr(m, "func", None)
        if func is not None:
            out.append(func)
    origin_args = typing.get_args(annotation)
    if meta:
        # Annotated[T, ...]: T is the first argument.
        origin_args = origin_args[:1]
    for arg in origin_args:
        if arg is not Ellipsis and arg is not type(None):
            out.extend(_validators(arg))
    return out


def _is_optional(annotation: Any) -> bool:
    if getattr(annotation, "__metadata__", ()):
        return _is_optional(typing.get_args(annotation)[0])
    return type(None) in typing.get_args(annotation)


def field_kind(model: type[BaseModel], name: str) -> FieldKind:
    """What ``model.name`` takes, from its declared type; KeyError for a field the model lacks."""
    info = model.model_fields[name]
    # pydantic keeps a field's outermost Annotated metadata apart from its annotation.
    funcs = [getattr(m, "func", None) for m in info.metadata] + _validators(info.annotation)
    low = high = None
    choices: tuple[str, ...] = ()
    flag = power = per_request = False
    for f in funcs:
        base = f.func if isinstance(f, partial) else f
        kind = models.VALIDATOR_KINDS.get(base)
        if kind == "integer" and low is None:
            low, high = f.keywords["low"], f.keywords["high"]
        elif kind == "choice" and not choices:
            choices = tuple(f.keywords["choices"])
        elif kind == "per_request":
            per_request = True
        elif kind == "flag":
            flag = True
        elif kind == "power_of_two":
            power = True
    return FieldKind(
        low=low,
        high=high,
        choices=choices,
        flag=flag,
        optional=_is_optional(info.annotation) or info.default is None,
        power_of_two=power,
        per_request=per_request,
    )
