"""``sglfix schema toggle|scenario``: the JSON Schemas of the YAML files users write, made from
the same pydantic models that validate them, plus what the models check outside a field: a
toggle has ``patches`` or ``parts`` (not both), part names are lowercase ids, a scenario file
holds one scenario or ``scenarios: [...]``, and a scenario with a ``grid`` may leave to it any key
the grid fills in. An editor with a YAML language server completes and checks files with them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import typer

from sglfix.cli.context import emit_json


class SchemaKind(StrEnum):
    toggle = "toggle"
    scenario = "scenario"


def schema_cmd(
    kind: SchemaKind = typer.Argument(..., help="Which file: toggle (toggles/<pr>.yaml) or scenario."),
) -> None:
    """Print the JSON Schema of toggle or scenario files (made from the models that validate them)."""
    emit_json(_toggle() if kind is SchemaKind.toggle else _scenario())


_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _toggle() -> dict[str, Any]:
    from sglfix.toggling.ids import PART_NAME_RE
    from sglfix.toggling.registry import ToggleFile

    out = ToggleFile.model_json_schema()
    props = out["properties"]
    props["parts"]["propertyNames"] = {"pattern": f"^{PART_NAME_RE.pattern}$"}
    props["pr"].update({"type": "integer", "minimum": 1})
    out["oneOf"] = [{"required": ["patches"]}, {"required": ["parts"]}]
    return {"$schema": _DIALECT, **out, "title": "sglfix toggle file (toggles/<pr>.yaml)"}


def _scenario() -> dict[str, Any]:
    from sglfix.scenario.models import ScenarioNode

    node = ScenarioNode.model_json_schema()
    defs = node.pop("$defs", {})
    required = node.pop("required", [])
    # A grid fills in keys of its own: a node with one needs only its name.
    node["if"] = {"required": ["grid"]}
    node["then"] = {"required": ["name"]}
    node["else"] = {"required": required}
    defs["ScenarioNode"] = node
    return {
        "$schema": _DIALECT,
        "title": "sglfix scenario file (one scenario, or scenarios: [...])",
        "anyOf": [
            {"$ref": "#/$defs/ScenarioNode"},
            {
                "type": "object",
                "properties": {
                    "scenarios": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/ScenarioNode"}}
                },
                "required": ["scenarios"],
                "additionalProperties": False,
            },
        ],
        "$defs": defs,
    }


def register(app: typer.Typer) -> None:
    app.command("schema")(schema_cmd)
