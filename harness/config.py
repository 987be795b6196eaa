"""The regress config (TOML): target, baseline, candidates, suites, profiles, seeds, gates.

See `regress.toml` at the repo root for the documented default. Every key's type, range, default
and meaning is declared once in harness.config_schema; `load_config` validates a file against it
(an unknown key named with the closest allowed one, a value of the wrong type or range named with
what it must be), then harness.config_resolve checks the rules across keys and resolves the
objects a run uses (harness.config_objects, re-exported here). Everything is checked on load so
that a typo fails in a second, not after an hour of generation.

A new key is one line in its table's class in harness.config_schema (type, range, default,
meaning) and, under the same name, one field on the object that carries it (RegressConfig,
Profile, EngineSpec; Gates and Slo are made from the schema and need none); `make docs` then
rewrites the schema file and the docs' tables. A rule that spans keys goes in config_resolve.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from harness import config_resolve as resolve
from harness import config_schema as schema
from harness.config_objects import (AS_LOGGED, IN_PROCESS, KEYED_NOISE, KINDS, NAME, ConfigError,  # noqa: F401
                                    ConfigWarning, DecoderSpec, Gates, Load, Profile, RegressConfig, Slo,
                                    SuiteSpec, sampled_identity_applies)


def load_config(path: str | Path, profile: str = "smoke") -> RegressConfig:
    """The config at `path`, validated against the schema and its rules across keys, with
    `profile` selected; a ConfigError names the first problem, its table and key."""
    path = Path(path)
    raw = resolve.read(path)
    try:
        doc = schema.Regress.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(schema.explain(e, raw, str(path))) from None
    baseline, candidates = resolve.decoders(doc, path)
    suites = {name: resolve.suite(name, t, path) for name, t in doc.suites.items()}
    if profile not in doc.profiles:
        raise ConfigError(f"{path}: unknown profile {profile!r}; defined: {', '.join(sorted(doc.profiles)) or 'none'}")
    where = f"{path} [profiles.{profile}]"
    prof, candidates = resolve.profile(profile, doc.profiles[profile], suites, candidates, where)
    engines = {name: resolve.engine(name, t, f"{path} [engines.{name}]") for name, t in doc.engines.items()}
    resolve.check_across(doc, baseline, candidates, engines, prof, path)
    gates = doc.gates.model_dump() | {"near_tie_epsilon": None if doc.gates.near_tie_epsilon == "auto"
                                      else doc.gates.near_tie_epsilon}
    made = dict(path=str(path), baseline=baseline, candidates=candidates, suites=suites, profile=prof,
                gates=Gates(**gates), labels=dict(doc.labels), engines=engines)
    return RegressConfig(**made, **resolve.as_given(RegressConfig, doc, made))  # target, device, chat, top_p, ...
