"""docs/configuration.md's key tables, written from the schema (harness.config_schema), so the
docs cannot drift from what the loader accepts. Each table sits between two markers:

    <!-- config-schema: TABLE -->  ...  <!-- /config-schema -->

and `decodegate config-schema --docs FILE` rewrites what lies between them (`make docs`);
tests/test_config_schema.py fails when the checked-in file is not what this writes.
"""
from __future__ import annotations

import json
import re

from harness import config_schema as schema

# Table name in the markers -> the schema's table. "profiles.slo" is the [profiles.NAME.slo] sub-table.
TABLES = {"top": schema.Regress, "decoder": schema.Decoder, "suite": schema.Suite, "profile": schema.Profile,
          "slo": schema.Slo, "gates": schema.Gates, "engine": schema.Engine}
MARK = re.compile(r"(<!-- config-schema: (\w+) -->\n).*?(<!-- /config-schema -->)", re.S)


def _type(prop: dict, defs: dict) -> str:
    """A JSON Schema property in words: "number in (0, 0.5)", "list of strings", "`\"fail\"` or `\"warn\"`"."""
    if "$ref" in prop:
        return "table"
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " or ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    kind = {"number": "number", "integer": "integer", "string": "string", "boolean": "bool",
            "array": "list", "object": "table"}.get(prop.get("type"), "any")
    if kind == "list":
        item = _type(prop.get("items", {}), defs)
        return f"list of {item}s" if " " not in item else f"list, each {item}"
    low = ("(" if "exclusiveMinimum" in prop else "[") + str(prop.get("exclusiveMinimum", prop.get("minimum", "")))
    high = str(prop.get("exclusiveMaximum", prop.get("maximum", ""))) + (")" if "exclusiveMaximum" in prop else "]")
    if low[1:] and high[:-1]:
        return f"{kind} in {low}, {high}"
    return f"{kind} ≥ {low[1:]}" if low[1:] and low[0] == "[" else f"{kind} > {low[1:]}" if low[1:] else kind


def _default(name: str, info) -> str:
    if info.is_required():
        return "required"
    value = info.default
    if value is None or value in ({}, []) or isinstance(value, schema.Table):
        return ""
    return f"`{json.dumps(value)}`"


def table(name: str) -> str:
    """One key table in Markdown: key, type, default, meaning."""
    model = TABLES[name]
    js = model.model_json_schema()
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, info in model.model_fields.items():
        prop = js["properties"][key]
        desc = (info.description or "").removeprefix("required: ").replace("|", "\\|").replace("*", "\\*")
        rows.append(f"| `{key}` | {_type(prop, js.get('$defs', {}))} | {_default(key, info)} | {desc} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with every marked table written afresh from the schema."""
    return MARK.sub(lambda m: m.group(1) + table(m.group(2)) + m.group(3), text)
