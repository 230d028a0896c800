"""pydantic models for YAML files, with the one-line errors users get: ``file:line: what; fix``.

Every model of a user-written file derives from ``StrictModel`` (unknown keys forbidden, frozen).
``validate_node(Model, node, where=path)`` validates a node loaded by ``yamlio.load_yaml`` (which
remembers lines) and turns the first pydantic error into a ``ConfigError`` naming the file, the
line of the offending key or item, the dotted path, and for an unknown key the nearest allowed one.
A validator that wants its own wording raises ``NodeError``; a ``ConfigModel`` built in Python
raises ``ConfigError`` too, so that callers catch one type whether the spec came from YAML or code.
"""

from __future__ import annotations

import difflib
import reprlib
import typing
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, dataclass_transform

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from sglfix.common.errors import ConfigError
from sglfix.common.yamlio import LineDict, LineList, line_of

__all__ = [
    "ClosedModel",
    "ConfigModel",
    "ModelT",
    "NodeError",
    "StrictModel",
    "describe_kind",
    "model_in",
    "nearest",
    "show",
    "validate_node",
]

ModelT = TypeVar("ModelT", bound=BaseModel)


class StrictModel(BaseModel):
    """Unknown keys are errors; values never change after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class ClosedModel(BaseModel):
    """What sglfix writes and reads back (its reports): unknown keys are damage and no value is
    converted (``"2"`` is not a number here)."""

    model_config = ConfigDict(extra="forbid", strict=True)


if TYPE_CHECKING:
    # Named for the checker only: pydantic keeps its metaclass private, so at run time it is
    # taken from BaseModel itself.
    from pydantic._internal._model_construction import ModelMetaclass as _ModelMetaclass
else:
    _ModelMetaclass = type(BaseModel)


# Repeated from pydantic's metaclass: a checker reads the fields of a model as its keyword
# arguments only where the model's own metaclass says so.
@dataclass_transform(kw_only_default=True, field_specifiers=(Field, PrivateAttr))
class _ConfigErrorOnCall(_ModelMetaclass):
    # Only a call from Python passes here; nested validation never does, so a model inside
    # another still reports its error with the full path and line.
    def __call__(cls, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            _, message = _describe(exc, cls, kwargs, what=cls.__name__)
            raise ConfigError(message) from None


class ConfigModel(StrictModel, metaclass=_ConfigErrorOnCall):
    """A StrictModel also built from Python (``EditSpec(match=...)``): a bad value raises
    ``ConfigError`` there as well, worded as for a file but without a line."""


class NodeError(ValueError):
    """A validator's own wording for what is wrong with a node.

    ``text`` reads after the node's dotted path (``"must be a positive PR number"`` gives
    ``pr must be a positive PR number``); at the top of a file it stands alone. ``at`` is a key,
    or a path of keys, below the node whose line to cite when the node's own line is not the
    one to fix (the second of two exclusive keys, an item of a list).
    """

    def __init__(self, text: str, *, at: Any = ()) -> None:
        super().__init__(text)
        self.text = text
        self.at: tuple = at if isinstance(at, tuple) else (at,)


def nearest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' or '' — appended to messages about unknown names."""
    found = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


class _ShortRepr(reprlib.Repr):
    """reprlib dispatches on the exact type name: LineDict/LineList would get a full, unbounded repr."""

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, dict) and type(x) is not dict:
            return self.repr_dict(x, level)
        if isinstance(x, list) and type(x) is not list:
            return self.repr_list(x, level)
        return super().repr1(x, level)


_repr = _ShortRepr()
_repr.maxlevel, _repr.maxlist, _repr.maxdict, _repr.maxstring, _repr.maxother = 2, 6, 4, 60, 60


def show(value: Any) -> str:
    """A short repr: a value from a user's file may be huge (or a YAML alias bomb)."""
    return _repr.repr(value)


def describe_kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, list) and not value:
        return "an empty list"
    for types_, name in (
        (dict, "a mapping"),
        (list, "a list"),
        (bool, "true/false"),
        ((int, float), "a number"),
        (str, "text"),
    ):
        if isinstance(value, types_):
            return name
    return type(value).__name__


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class an annotation holds (directly, Optional, list[...] or dict[..., ...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is None:
        return None
    for arg in typing.get_args(annotation):
        found = model_in(arg)
        if found is not None:
            return found
    return None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _walk(model: type[BaseModel], node: Any, loc: tuple) -> tuple[type[BaseModel] | None, Any, Any]:
    """Follow ``loc`` through the node and the model: (model at the parent, parent node, last key)."""
    current_model: type[BaseModel] | None = model
    parent: Any = node
    for key in loc[:-1]:
        child = None
        if (isinstance(parent, dict) and key in parent) or (
            isinstance(parent, list) and isinstance(key, int) and key < len(parent)
        ):
            child = parent[key]
        if isinstance(key, str) and current_model is not None and key in current_model.model_fields:
            current_model = model_in(current_model.model_fields[key].annotation)
        elif not isinstance(key, int):
            # A dict key (a part name) keeps the model of the dict's values.
            pass
        if child is None:
            return current_model, parent, key
        parent = child
    return current_model, parent, loc[-1] if loc else None


def _dotted(loc: tuple) -> str:
    out = ""
    for key in loc:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def validate_node(
    model: type[ModelT], node: Any, *, where: str, what: str = "", context: dict | None = None, root: str = ""
) -> ModelT:
    """Validate ``node`` as ``model``; the first error becomes a one-line ``ConfigError``.

    ``what`` prefixes every dotted path; ``root`` names the node itself in messages about its
    keys ("unknown key 'x' in toggle file"), by default ``what`` or "the file".
    """
    try:
        return model.model_validate(node, context=context)
    except ValidationError as exc:
        line, message = _describe(exc, model, node, what=what, root=root)
        raise ConfigError(f"{where}:{line}: {message}") from None


def _line_at(node: Any, keys: tuple, *, at: tuple = ()) -> int:
    """The line to cite for the value at ``keys``: the line of the key ``at`` names when it
    names one; else the value's own line when it is a mapping or a list (it may start below its
    key), else its key's line. Cut short, the deepest line known."""
    parent, last, value = None, None, node
    for key in keys:
        if not isinstance(value, (dict, list)):
            break
        try:
            child = value[key]
        except (KeyError, IndexError, TypeError):
            return line_of(value, key)
        parent, last, value = value, key, child
    if isinstance(value, (LineDict, LineList)) and value.line and not at:
        return value.line
    return line_of(parent, last) if parent is not None else line_of(node)


def _describe(exc: ValidationError, model: type[BaseModel], node: Any, *, what: str, root: str = "") -> tuple[int, str]:
    errors = exc.errors(include_url=False)
    # Unknown keys first: they usually explain the rest (a misspelt required key).
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    loc = tuple(k for k in err["loc"] if not (isinstance(k, str) and k.startswith("function-")))
    parent_model, parent, key = _walk(model, node, loc)
    line = line_of(parent, key) if key is not None else line_of(node)
    path = _dotted(loc)
    prefix = f"{what}." if what and path else what
    root = root or what or "the file"
    label = f"{prefix}{path}" if path else root
    kind = err["type"]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, NodeError):
        line = _line_at(node, loc + cause.at, at=cause.at)
        subject = f"{prefix}{path}" if path else what
        message = f"{subject} {cause.text}" if subject else cause.text
    elif kind == "extra_forbidden":
        allowed = _field_names(parent_model) if parent_model is not None else []
        owner = f"{prefix}{_dotted(loc[:-1])}" if loc[:-1] else root
        message = f"unknown key {key!r} in {owner}{nearest(str(key), allowed)}" + (
            f"; allowed: {', '.join(allowed)}" if allowed else ""
        )
    elif kind == "missing":
        owner = f"{prefix}{_dotted(loc[:-1])}" if loc[:-1] else root
        line = line_of(parent)
        message = f"{owner} lacks required key {key!r}"
    elif kind == "model_type" or kind == "dict_type":
        message = f"{label} must be a mapping; got {describe_kind(err.get('input'))}"
    else:
        text = err["msg"]
        if text.startswith("Value error, "):
            text = text[len("Value error, ") :]
        elif text.startswith("Assertion failed, "):
            text = text[len("Assertion failed, ") :]
        else:
            text = f"{text}; got {show(err.get('input'))}"
        message = f"{label}: {text}" if path or what else text
    return line, message
