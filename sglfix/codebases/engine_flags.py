"""The engine flags a code base declares (sglang: the fields of ``srt/environ.py``'s ``Envs``),
read from its source without importing it, so that a scenario's ``env:`` is checked in the
parent before any cell runs: an unknown name gets the nearest one, a value the flag's own parser
would refuse (it would warn and run the default instead) gets the values it takes.
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache

from sglfix.common.errors import ConfigError

__all__ = ["check_env", "declared_flags"]

# The flag classes of sglang's environ module by what they parse; the *WithAlias ones read a
# deprecated name as well and parse as their base.
_KINDS = {
    "EnvBool": "bool",
    "EnvBoolWithAlias": "bool",
    "EnvInt": "int",
    "EnvIntWithAlias": "int",
    "EnvFloat": "float",
    "EnvStr": "str",
    "EnvStrWithAlias": "str",
    "EnvTuple": "str",
    "EnvJSON": "json",
}
_BOOL_WORDS = ("true", "1", "yes", "y", "false", "0", "no", "n")


@lru_cache(maxsize=8)
def declared_flags(path: str, owner: str) -> dict[str, str]:
    """Flag name -> kind (bool, int, float, str, json, or the class name where unknown) of the
    class ``owner`` in the Python file ``path``."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=path)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == owner):
            continue
        for item in node.body:
            target = item.targets[0] if isinstance(item, ast.Assign) and len(item.targets) == 1 else None
            if isinstance(item, ast.AnnAssign):
                target = item.target
            value = getattr(item, "value", None)
            if isinstance(target, ast.Name) and isinstance(value, ast.Call):
                func = value.func
                cls = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if cls.startswith("Env"):
                    found[target.id] = _KINDS.get(cls, cls)
    return found


def _value_error(kind: str, value: str) -> str:
    if kind == "bool" and value.lower() not in _BOOL_WORDS:
        return "takes true or false (1/0, yes/no)"
    for cast, name in ((int, "int"), (float, "float")):
        if kind == name:
            try:
                cast(value)
            except ValueError:
                return f"takes {'an integer' if name == 'int' else 'a number'}"
    return ""


def check_env(env: dict[str, str], *, root: str, source: str, where: str, what: str) -> None:
    """Refuse, in one line naming the flag, an ``env:`` the code base at ``root`` (its package
    folder) does not declare or whose value its parser refuses; ``source`` is
    ``relative/path.py:Class``, where the code base declares its flags."""
    from sglfix.common.schema import nearest

    rel, _, owner = source.partition(":")
    path = os.path.join(root, rel)
    try:
        flags = declared_flags(path, owner)
    except (OSError, SyntaxError) as exc:
        raise ConfigError(f"{where}: env: {what}'s engine flags cannot be read from {rel}: {exc}") from None
    for name, value in env.items():
        kind = flags.get(name)
        if kind is None:
            raise ConfigError(
                f"{where}: env: {name} is no engine flag of {what}{nearest(name, list(flags))} "
                f"(its flags are the fields of {owner} in {rel})"
            )
        wrong = _value_error(kind, value)
        if wrong:
            raise ConfigError(f"{where}: env: {name} {wrong}, got {value!r}")
