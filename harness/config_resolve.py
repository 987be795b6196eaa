"""Resolving a validated regress config into the objects a run uses (harness.config), and the
rules across keys that a schema of one key at a time cannot say: a profile's suites and
candidates exist, an engine a decoder names is defined, exactly one of base_url or launch, ...
Each rule names the table and the keys it concerns."""
from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from pathlib import Path

from decoders.base import seed_problem, temperature_problem
from harness import config_schema as schema
from harness.config_objects import (AS_LOGGED, IN_PROCESS, NAME, ConfigError, ConfigWarning, DecoderSpec, Load, Profile,
                            Slo, SuiteSpec)


def hint(name, known) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""



def as_given(cls, table: schema.Table, made: dict) -> dict:
    """The fields of `cls` (a resolved object) that its schema table holds as they are: a key
    added to both (same name) reaches the run without a line here."""
    return {f.name: getattr(table, f.name) for f in dataclasses.fields(cls)
            if f.name not in made and f.name in type(table).model_fields}


def read(path: Path) -> dict:
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder; give the TOML file, e.g. {path / 'regress.toml'}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))  # TOML is UTF-8, whatever the locale says
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 (byte 0x{e.object[e.start]:02x} on line {line}); TOML files are "
                          f"UTF-8") from None


def decoder(t: schema.Decoder, where: str) -> DecoderSpec:
    if t.acceptance_tolerance is not None and t.acceptance_reference is None:
        raise ConfigError(f"{where}: acceptance_tolerance needs an acceptance_reference")
    if "verify" in t.options and t.decoder != "speculative":
        raise ConfigError(f"{where}: option 'verify' applies to the speculative decoder only")
    # Without a name, the decoder's own ("module:Class" for a team's decoder, made a name).
    name = t.name if t.name is not None else (
        re.sub(r"[^A-Za-z0-9_.+=-]", "-", t.decoder).lstrip("_.+=-")[:80] or "decoder")
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: name {name!r} may hold only letters, digits and _ . - + = (at most 80, "
                          f"starting with a letter or digit): it names folders, MLflow runs and JUnit cases")
    options = dict(t.options)
    if t.decoder == "speculative" and "verify" not in options:
        # Make the sampled verifier explicit, so gates and tags never guess the decoder's default.
        from decoders.speculative import DEFAULT_VERIFIER
        options["verify"] = DEFAULT_VERIFIER
    return DecoderSpec(name=name, decoder=t.decoder, options=options, kind=t.kind, target=t.target,
                       min_speedup=t.min_speedup, labels=dict(t.labels),
                       suites=tuple(t.suites) if t.suites is not None else None,
                       acceptance_reference=t.acceptance_reference, acceptance_tolerance=t.acceptance_tolerance)


def _check_option_names(spec: DecoderSpec, where: str) -> None:
    """A misspelt option named with the closest valid one, before any model loads (the decoder
    itself refuses it too, but only once the models are loaded, and without the hint)."""
    if spec.decoder not in IN_PROCESS:
        return
    import inspect
    from decoders import get_decoder_class
    params = inspect.signature(get_decoder_class(spec.decoder).__init__).parameters.values()
    allowed = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self", "target"}
    if "draft" in allowed:
        allowed.add("draft_device")  # taken by harness.build, which places a draft model
    unknown = sorted(set(spec.options) - allowed)
    if unknown:
        raise ConfigError(f"{where}: {spec.name!r} (decoder {spec.decoder!r}): takes no option(s) "
                          f"{', '.join(unknown)}{hint(unknown[0], allowed)}; its options: {', '.join(sorted(allowed))}")


def suite(name: str, t: schema.Suite, path: Path) -> SuiteSpec:
    where = f"{path} [suites.{name}]"
    lmeval = name.startswith("lmeval:")
    if "allow_code" in t.model_fields_set and not lmeval:
        raise ConfigError(f"{where}: allow_code applies to lmeval:<task> suites only")
    if (t.include_path or t.limit is not None or t.max_gen_toks is not None) and not lmeval:
        raise ConfigError(f"{where}: include_path/limit/max_gen_toks apply to lmeval:<task> suites only")
    # A suite file relative to the config file; "hf:DATASET[@split]" is a dataset, not a file.
    file, include = t.path, t.include_path
    if file is not None and not file.startswith("hf:") and not Path(file).is_absolute():
        file = str(path.parent / file)
    if include is not None and not Path(include).is_absolute():
        include = str(path.parent / include)
    return SuiteSpec(name, t.margin, file, include, t.limit, t.max_gen_toks, t.discordance, t.allow_code)


def _names(names: list[str] | None, key: str, where: str) -> None:
    if names is None:
        return
    if not all(n.strip() for n in names):
        raise ConfigError(f"{where}: {key} must be a list of names (strings), got {names!r}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{where}: {key} names {', '.join(repeated)} more than once")


def _sampling(p: schema.Profile, where: str) -> tuple[float, ...]:
    """The temperatures and seeds: each usable by a request (decoders.base), none repeated."""
    # + 0.0 turns -0.0 into 0.0: both are greedy (t == 0), but f"T={t:g}" keys -0.0 as "T=-0", which
    # the greedy identity gate would not find.
    temps = () if p.temperatures == AS_LOGGED else tuple(float(t) + 0.0 for t in p.temperatures)
    for t in temps:  # the requests' own rule, said here before any model loads
        if temperature_problem(t):
            raise ConfigError(f"{where}: temperatures: {temperature_problem(t)}")
    if len(set(temps)) != len(temps) or len(set(p.seeds)) != len(p.seeds):
        raise ConfigError(f"{where}: temperatures and seeds must not repeat")
    for x in p.seeds:
        if seed_problem(x):
            raise ConfigError(f"{where}: seeds: {seed_problem(x)}")
    return temps


def _load(p: schema.Profile, where: str) -> Load | None:
    """A profile's open-loop keys -> Load (None when it has no `rates`)."""
    given = p.model_fields_set & {"burstiness", "max_in_flight", "load_requests", "load_seed", "refine_levels", "slo",
                                  "client_workers"}
    if p.rates is None:
        if given:
            raise ConfigError(f"{where}: {', '.join(sorted(given))} need rates = [...] (requests per second)")
        return None
    if len(set(p.rates)) != len(p.rates):
        raise ConfigError(f"{where}: rates must be a list of distinct request rates > 0 (per second), e.g. [0.5, 1, 2]")
    return Load(rates=tuple(sorted(float(r) for r in p.rates)), burstiness=float(p.burstiness),
                max_in_flight=p.max_in_flight, requests=p.load_requests, seed=p.load_seed,
                refine_levels=p.refine_levels, client_workers=p.client_workers, slo=Slo(**{k: float(v) for k, v in p.slo.model_dump().items()
                                                           if v is not None}))


def profile(name: str, p: schema.Profile, suites: dict, candidates: tuple, where: str) -> tuple[Profile, tuple]:
    """The profile a run covers, and the candidates it selects."""
    for key in ("suites", "sample_suites"):
        _names(getattr(p, key), key, where)
    suite_names = tuple(p.suites if p.suites is not None else suites)
    for s in suite_names:
        suites.setdefault(s, SuiteSpec(s))
    temps = _sampling(p, where)
    unknown = set(p.sample_suites or ()) - set(suite_names)
    if unknown:
        raise ConfigError(f"{where}: sample_suites {sorted(unknown)} are not in this profile's suites")
    levels = [p.concurrency] if isinstance(p.concurrency, int) else p.concurrency
    if len(set(levels)) != len(levels):
        raise ConfigError(f"{where}: concurrency must be a list of distinct integers >= 1, e.g. [1, 4, 16]")
    if p.candidates is not None:
        known = [c.name for c in candidates]
        for n in p.candidates:
            if n not in known:
                raise ConfigError(f"{where}: candidates names {n!r}{hint(n, known)}, which no [[candidates]] defines")
        candidates = tuple(c for c in candidates if c.name in p.candidates)
        if not candidates:  # a run of the baseline alone would gate nothing and exit 0
            raise ConfigError(f"{where}: candidates = [] selects no candidate; name at least one of "
                              f"{', '.join(known)}, or leave the key out to run them all")
    subset = p.subset or name
    if subset not in ("smoke", "full"):
        raise ConfigError(f"{where}: subset must be 'smoke' or 'full'")
    made = dict(name=name, subset=subset, suites=suite_names, temperatures=temps,
                sample_suites=tuple(p.sample_suites if p.sample_suites is not None else suite_names),
                seeds=tuple(p.seeds), concurrency=tuple(levels), as_logged=p.temperatures == AS_LOGGED,
                load=_load(p, where), top_k=p.top_k or 0)
    prof = Profile(**made, **as_given(Profile, p, made))
    _check_seeds(prof, where)
    return prof, candidates


def _check_seeds(prof: Profile, where: str) -> None:
    """A sampled identity check at one seed cannot see a decoder that ignores the seed; at seed 0
    alone it cannot see one that always uses 0."""
    import warnings
    sampled = any(t > 0 for t in prof.temperatures) and prof.sample_suites
    if sampled and (len(prof.seeds) < 2 or all(s == 0 for s in prof.seeds)):
        warnings.warn(f"{where}: seeds {list(prof.seeds)}: sampled checks need at least two seeds, one of them "
                      f"not 0 (a decoder that ignores the request's seed passes at one)", ConfigWarning, stacklevel=4)


def engine(name: str, t: schema.Engine, where: str):
    """An [engines.NAME] table -> EngineSpec. Secrets never sit in the config: `api_key_env`
    names the environment variable that holds the key."""
    import os
    import shlex
    from decoders.engines.server import EngineSpec
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: engine name {name!r} may hold only letters, digits and _ . - + = (it names "
                          f"the engine's log file)")
    if bool(t.base_url) == bool(t.launch):
        raise ConfigError(f"{where}: give exactly one of base_url (an engine already running) "
                          f"or launch (a command decodegate starts)")
    launch = shlex.split(t.launch) if isinstance(t.launch, str) else t.launch
    if launch is not None and not launch:
        raise ConfigError(f"{where}: launch must be a command: a string or a list of strings")
    if launch is not None and not any("{port}" in a for a in launch):
        raise ConfigError(f"{where}: launch must contain {{port}} (decodegate picks a free port)")
    if t.reuse_baseline and launch:
        # A URL does not identify the deployment behind it: its rows are reused only where the
        # config vouches that it is pinned (harness.run.reuse); a launched engine is keyed by itself.
        raise ConfigError(f"{where}: reuse_baseline is for a base_url engine; a launched engine is keyed "
                          f"by its command, files and environment, and reused without it")
    if t.api_key_env and t.api_key_env not in os.environ:
        raise ConfigError(f"{where}: api_key_env names ${t.api_key_env}, which is not set")
    kw = t.model_dump(exclude={"launch", "api_key_env", "env"})
    return EngineSpec(name=name, launch=tuple(launch) if launch else None, env={k: str(v) for k, v in t.env.items()},
                      api_key=os.environ.get(t.api_key_env) if t.api_key_env else None, **kw)


def decoders(doc: schema.Regress, path: Path) -> tuple[DecoderSpec, tuple[DecoderSpec, ...]]:
    """The baseline (default: standard, named baseline) and the candidates, names unique."""
    baseline = decoder(doc.baseline or schema.Decoder(decoder="standard", name="baseline"), f"{path} [baseline]")
    candidates = tuple(decoder(c, f"{path} [[candidates]] #{i + 1}") for i, c in enumerate(doc.candidates))
    if not candidates:
        raise ConfigError(f"{path}: no [[candidates]] to compare with the baseline")
    for spec in (baseline, *candidates):
        _check_option_names(spec, str(path))
    names = [baseline.name] + [c.name for c in candidates]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"{path}: decoder names must be unique; repeated: {', '.join(sorted(dupes))}")
    return baseline, candidates


def check_across(doc: schema.Regress, baseline: DecoderSpec, candidates: tuple, engines: dict, prof: Profile,
                 path: Path) -> None:
    """The rules between the resolved tables: suites a candidate lists, engines, label names."""
    for c in candidates:
        for s in c.suites or ():
            if s not in prof.suites:
                raise ConfigError(f"{path}: candidate {c.name!r} lists suite {s!r}{hint(s, prof.suites)}, "
                                  f"which profile {prof.name!r} does not run")
    _check_engines(baseline, candidates, engines, prof, path)
    for label in [*doc.labels, *(k for c in candidates for k in c.labels)]:
        if not all(ch.isalnum() or ch in "_-./ " for ch in label):
            raise ConfigError(f"{path}: label name {label!r} may hold only letters, digits and _ - . / space")
    if not prof.suites:  # a run of no prompts gates nothing: refused now, not a FAIL after the models load
        raise ConfigError(f"{path} [profiles.{prof.name}]: suites is empty; name at least one suite (shipped: "
                          f"factual, code, refusal, longform, humaneval; or a [suites.NAME] table with a path)")


def _check_engines(baseline: DecoderSpec, candidates: tuple, engines: dict, prof: Profile, path: Path) -> None:
    """Every engine a decoder or the profile names is defined, and the A/A run runs the baseline's model."""
    where, known = f"{path} [profiles.{prof.name}]", f"defined: {', '.join(sorted(engines)) or 'none'}"
    if "aa_engine" in baseline.options and "engine" not in baseline.options:
        raise ConfigError(f"{path} [baseline]: aa_engine (where the A/A run goes) needs an engine baseline")
    for spec, name in [(s, s.options.get(k)) for s in (baseline, *candidates) for k in ("engine", "aa_engine")]:
        if name is not None and name not in engines:
            raise ConfigError(f"{path}: {spec.name!r} names engine {name!r}{hint(name, engines)}, which no "
                              f"[engines.NAME] table defines ({known})")
    aa, own = baseline.options.get("aa_engine"), baseline.options.get("engine")
    if aa is not None and engines[aa].model and engines[own].model and engines[aa].model != engines[own].model:
        # The A/A run is the baseline's noise floor: on another model it measures that model's
        # disagreement, and excuses a candidate's divergences up to it.
        raise ConfigError(f"{path} [baseline]: aa_engine {aa!r} serves model {engines[aa].model!r}, the baseline's "
                          f"engine {own!r} serves {engines[own].model!r}: the A/A run must run the baseline's model")
    ref = prof.exactness_reference
    if ref.startswith("engine:") and ref[len("engine:"):] not in engines:
        raise ConfigError(f"{where}: exactness_reference names engine {ref[len('engine:'):]!r}, which no "
                          f"[engines.NAME] table defines ({known})")
    if prof.load is not None and not (isinstance(baseline.options.get("engine"), str)
                                      and any(isinstance(c.options.get("engine"), str) for c in candidates)):
        # Open-loop arrivals need a server that queues and batches; in-process decoders are batch-1.
        raise ConfigError(f"{where}: rates (open-loop load) need an engine baseline and at least one engine "
                          f"candidate (options = {{ engine = \"NAME\" }})")

