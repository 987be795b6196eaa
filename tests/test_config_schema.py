"""The regress config's one declaration (harness.config_schema) and what is made from it: the JSON
Schema `decodegate config-schema` prints (checked in as regress.schema.json, which the shipped
configs name in their `#:schema` line), docs/configuration.md's key tables, and the loader's
messages. Each test fails when one of them drifts from the declaration."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest

from harness.cli import main
from harness.config import ConfigError, load_config
from harness.config_docs import TABLES, render
from harness.config_schema import SCHEMA_FILE, SPENDING, Regress

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*ROOT.glob("regress*.toml"), *(ROOT / "scripts").glob("*.toml")])


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("schema") / "schema.json"
    assert main(["config-schema", "--output", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_checked_in_schema_is_the_printed_one(printed, capsys):
    assert main(["config-schema"]) == 0
    assert json.loads(capsys.readouterr().out) == printed
    # `make docs` writes it; a schema edited without it is stale here.
    assert json.loads((ROOT / SCHEMA_FILE).read_text()) == printed, "run `make docs`"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_names_and_passes_the_printed_schema(path, printed):
    text = path.read_text()
    first = text.splitlines()[0]
    assert re.fullmatch(r"#:schema \S+", first), f"{path.name}: the first line is the #:schema line taplo reads"
    assert (path.parent / first.split()[1]).resolve() == ROOT / SCHEMA_FILE
    jsonschema.validate(tomllib.loads(text), printed, cls=jsonschema.Draft202012Validator)


def test_the_docs_tables_are_the_schemas(tmp_path):
    docs = (ROOT / "docs" / "configuration.md").read_text()
    for name in TABLES:
        assert f"<!-- config-schema: {name} -->" in docs, name
    assert render(docs) == docs, "docs/configuration.md's key tables are stale: run `make docs`"
    # The check sees a change: one description edited is a different table.
    from harness import config_schema
    info = config_schema.Gates.model_fields["alpha"]
    saved = info.description
    try:
        info.description = "edited"
        assert render(docs) != docs
    finally:
        info.description = saved


def test_the_spending_rules_are_analysis_sequentials():
    from analysis.sequential import SPENDING as IMPLEMENTED
    assert SPENDING == IMPLEMENTED


# A value of the wrong type for each key: a string where a table goes, a table anywhere else.
def _wrong(prop: dict):
    kinds = {p.get("type") for p in prop.get("anyOf", [prop])} | ({"object"} if "$ref" in prop else set())
    return "x" if "object" in kinds else {"x": 1}


def _minimal(tmp_path: Path, table: str, key: str, value) -> dict:
    raw = {"target": "tiny-llama", "candidates": [{"decoder": "standard", "name": "c"}],
           "profiles": {"smoke": {"suites": ["factual"]}}}
    where = {"top": raw, "decoder": raw["candidates"][0], "profile": raw["profiles"]["smoke"],
             "suite": raw.setdefault("suites", {}).setdefault("factual", {}),
             "slo": raw["profiles"]["smoke"].setdefault("slo", {}), "gates": raw.setdefault("gates", {}),
             "engine": raw.setdefault("engines", {}).setdefault("e", {"base_url": "http://127.0.0.1:9"})}[table]
    where[key] = value
    return raw


@pytest.mark.parametrize("table, key", [(t, k) for t, m in TABLES.items() for k in m.model_fields])
def test_every_key_of_the_wrong_type_is_refused_by_both_and_named(tmp_path, printed, table, key):
    """The loader and the printed schema refuse the same value, and the message names the key
    (a table made without the schema's help would miss a key: this walks every one)."""
    prop = TABLES[table].model_json_schema()["properties"][key]
    raw = _minimal(tmp_path, table, key, _wrong(prop))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, printed, cls=jsonschema.Draft202012Validator)
    cfg = tmp_path / "c.toml"
    cfg.write_text(_toml(raw))
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}'? must be|{re.escape(key)}.*must be a table"):
        load_config(cfg, "smoke")


def _toml(raw: dict) -> str:
    """A small TOML writer for the dicts above (inline tables for nested values)."""
    def value(v):
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()
    return "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in raw.items())


def test_an_unknown_key_anywhere_is_named_with_the_closest(tmp_path):
    for table, key, close in [("top", "trace_limt", "trace_limit"), ("slo", "ttft_p59_s", "ttft_p95_s"),
                              ("engine", "retires", "retries"), ("suite", "margn", "margin")]:
        cfg = tmp_path / "c.toml"
        cfg.write_text(_toml(_minimal(tmp_path, table, key, 1)))
        with pytest.raises(ConfigError, match=rf"unknown key '{key}' \(did you mean '{close}'\?\); allowed: "):
            load_config(cfg, "smoke")


def test_the_schema_is_strict_where_the_loader_was():
    """1 is not true, "1" is not 1, true is not 1: a TOML value of another type is refused, not coerced."""
    for bad in ({"log_text": 1}, {"trace_limit": "1"}, {"trace_limit": True}, {"top_p": True}):
        with pytest.raises(Exception):
            Regress.model_validate({"target": "t", **bad})


def test_every_key_reaches_the_run():
    """A key added to the schema but to no object would be accepted and then dropped: each one is
    a field of the object that carries it, or one of the keys resolved into another shape."""
    import dataclasses

    from decoders.engines.server import EngineSpec
    from harness import config_schema as schema
    from harness.config import DecoderSpec, Gates, Profile, RegressConfig, Slo, SuiteSpec
    resolved = {  # schema table -> (object, keys it resolves into other fields)
        schema.Regress: (RegressConfig, {"profiles"}),
        schema.Profile: (Profile, {"candidates", "rates", "burstiness", "max_in_flight", "load_requests",
                                   "load_seed", "refine_levels", "slo", "client_workers"}),
        schema.Decoder: (DecoderSpec, set()), schema.Suite: (SuiteSpec, set()), schema.Gates: (Gates, set()),
        schema.Slo: (Slo, set()), schema.Engine: (EngineSpec, {"launch", "api_key_env"}),
    }
    for table, (obj, other) in resolved.items():
        fields = {f.name for f in dataclasses.fields(obj)}
        assert set(table.model_fields) - other <= fields, (table.__name__, set(table.model_fields) - other - fields)
