"""The regress config (TOML): target, baseline, candidates, suites, profiles, seeds, gates.

See `regress.toml` at the repo root for the documented default. Every key's type, range, default
and meaning is declared once in harness.config_schema; this module validates a file against it
(an unknown key named with the closest allowed one, a value of the wrong type or range named with
what it must be), checks the rules across keys, and resolves the objects the run uses. Everything
is checked on load so that a typo fails in a second, not after an hour of generation.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from decoders.base import seed_problem, temperature_problem
from harness import config_schema as schema


class ConfigError(ValueError):
    """A regress config that cannot be used as written."""


class ConfigWarning(UserWarning):
    """A config that runs, but whose checks cannot see something (e.g. one sampling seed)."""


@dataclass(frozen=True)
class DecoderSpec:
    name: str                       # label used in records, reports, MLflow
    decoder: str                    # backend: standard, speculative, early-exit, hf, hf-assisted
    options: dict = field(default_factory=dict)
    kind: str = "exact"             # exact: outputs must not move; lossy: may move within budget
    target: str | None = None       # another target (e.g. a quantized sibling) for lossy candidates
    min_speedup: float | None = None
    labels: dict = field(default_factory=dict)  # team / cost-center labels, copied to MLflow tags
    suites: tuple[str, ...] | None = None       # run only on these suites (default: all)
    role: str = "candidate"                     # "aa-floor": the baseline run again (harness.run.sweep)
    acceptance_reference: str | None = None     # a run folder or "mlflow:last" (harness.verdict.acceptance_ref)
    acceptance_tolerance: float | None = None   # the relative drop tolerated against it (None: 0.05)


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    margin: float | None = None     # non-inferiority margin on the pass rate; None: no quality gate
    path: str | None = None         # a suite file of one's own, resolved (default: the shipped suite NAME)
    include_path: str | None = None  # "lmeval:<task>": a folder of local task YAMLs
    limit: int | None = None
    max_gen_toks: int | None = None
    discordance: float | None = None  # planning: the share of pairs expected to disagree (default [gates])
    allow_code: bool = False


def _frozen(model, name: str, overrides: dict | None = None, namespace: dict | None = None):
    """A frozen dataclass with the fields and defaults of a schema table (declared there, once)."""
    overrides = overrides or {}
    cls = dataclasses.make_dataclass(name, [(k, object, field(default=overrides.get(k, f.default)))
                                            for k, f in model.model_fields.items()],
                                     frozen=True, namespace=namespace or {})
    cls.__module__, cls.__doc__ = __name__, model.__doc__ or f"[{name.lower()}] as resolved: see harness.config_schema"
    return cls


# Latency objectives per load level (seconds; None: not set), gated where the baseline meets them.
Slo = _frozen(schema.Slo, "Slo", namespace={"items": lambda self: {k: v for k, v in self.__dict__.items()
                                                                   if v is not None}})
# The gate's levels and rules; near_tie_epsilon None is "auto" (analysis.identity.near_tie_epsilon).
Gates = _frozen(schema.Gates, "Gates", {"near_tie_epsilon": None})


@dataclass(frozen=True)
class Load:
    """Open-loop load (harness.run.load): requests arrive at `rates` per second on a seeded schedule."""
    rates: tuple[float, ...]
    burstiness: float = 1.0
    max_in_flight: int | None = None
    requests: int = 60
    seed: int = 0
    refine_levels: int = 2
    slo: Slo = Slo()


@dataclass(frozen=True)
class Profile:
    name: str
    subset: str                     # "smoke" or "full"
    suites: tuple[str, ...]
    temperatures: tuple[float, ...]
    sample_suites: tuple[str, ...]  # suites also run at temperatures > 0
    seeds: tuple[int, ...]
    max_new_tokens: int | None      # cap on every item's budget
    exactness_prompts: int
    exactness_samples: int
    concurrency: tuple[int, ...] = ()  # engine requests in flight: one paired comparison per level
    as_logged: bool = False            # temperatures = "as-logged": each item's own sampling (suites import)
    looks: int = 1                     # quality looks per suite (group-sequential; 1: the fixed design)
    speed_items: int = 30              # baseline items timed afresh when the rest comes from the store
    load: Load | None = None           # open-loop arrival rates, SLOs (None: no load phase)
    exactness_reference: str = "target"  # "target" or "engine:NAME" (harness.run.engine_exactness)
    top_k: int = 0                     # the top-k cut at sampling temperatures (0: none)


@dataclass(frozen=True)
class RegressConfig:
    path: str
    target: str
    device: str | None
    chat: bool | None
    top_p: float
    baseline: DecoderSpec
    candidates: tuple[DecoderSpec, ...]
    suites: dict[str, SuiteSpec]
    profile: Profile
    gates: Gates
    labels: dict
    engines: dict = field(default_factory=dict)   # name -> decoders.engines.server.EngineSpec
    log_text: bool = True
    trace_limit: int = 100


# Decoders that sample with the keyed noise of `standard`, so sampled outputs can be identical.
# transformers' peers sample from torch's global generator: only their greedy output can match.
KEYED_NOISE = ("standard", "early-exit")
KINDS = ("exact", "lossy")
AS_LOGGED = "as-logged"  # profile temperatures: each suite item's logged sampling settings
# In-process decoders: every option is a named parameter of the class (decoders.common.reject_options).
IN_PROCESS = ("standard", "speculative", "early-exit", "hf", "hf-assisted")
# A decoder's or an engine's name becomes a folder, an MLflow run name and search filter, a JUnit
# class name and a Markdown cell: no path separators, quotes, markup or control characters. '@' and
# '~' are left out too: the harness derives names with them (spec@c4, base~aa).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,79}")


def sampled_identity_applies(decoder: str, options: dict) -> bool:
    """Whether an exact decoder's *sampled* output must match the baseline token for token."""
    if decoder == "speculative":
        # Rejection sampling is exact in distribution only; its sampled outputs may differ by design.
        return (options or {}).get("verify") == "coupled"
    return decoder in KEYED_NOISE


def _hint(name, known) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""



def _read(path: Path) -> dict:
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


def _decoder(t: schema.Decoder, where: str) -> DecoderSpec:
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
                          f"{', '.join(unknown)}{_hint(unknown[0], allowed)}; its options: {', '.join(sorted(allowed))}")


def _suite(name: str, t: schema.Suite, path: Path) -> SuiteSpec:
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
    temps = () if p.temperatures == AS_LOGGED else tuple(float(t) for t in p.temperatures)
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
    given = p.model_fields_set & {"burstiness", "max_in_flight", "load_requests", "load_seed", "refine_levels", "slo"}
    if p.rates is None:
        if given:
            raise ConfigError(f"{where}: {', '.join(sorted(given))} need rates = [...] (requests per second)")
        return None
    if len(set(p.rates)) != len(p.rates):
        raise ConfigError(f"{where}: rates must be a list of distinct request rates > 0 (per second), e.g. [0.5, 1, 2]")
    return Load(rates=tuple(sorted(float(r) for r in p.rates)), burstiness=float(p.burstiness),
                max_in_flight=p.max_in_flight, requests=p.load_requests, seed=p.load_seed,
                refine_levels=p.refine_levels, slo=Slo(**{k: float(v) for k, v in p.slo.model_dump().items()
                                                           if v is not None}))


def _profile(name: str, p: schema.Profile, suites: dict, candidates: tuple, where: str) -> tuple[Profile, tuple]:
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
                raise ConfigError(f"{where}: candidates names {n!r}{_hint(n, known)}, which no [[candidates]] defines")
        candidates = tuple(c for c in candidates if c.name in p.candidates)
        if not candidates:  # a run of the baseline alone would gate nothing and exit 0
            raise ConfigError(f"{where}: candidates = [] selects no candidate; name at least one of "
                              f"{', '.join(known)}, or leave the key out to run them all")
    subset = p.subset or name
    if subset not in ("smoke", "full"):
        raise ConfigError(f"{where}: subset must be 'smoke' or 'full'")
    prof = Profile(name=name, subset=subset, suites=suite_names, temperatures=temps or (() if p.temperatures ==
                   AS_LOGGED else (0.0,)), sample_suites=tuple(p.sample_suites if p.sample_suites is not None
                                                               else suite_names),
                   seeds=tuple(p.seeds), max_new_tokens=p.max_new_tokens, exactness_prompts=p.exactness_prompts,
                   exactness_samples=p.exactness_samples, concurrency=tuple(levels),
                   as_logged=p.temperatures == AS_LOGGED, looks=p.looks, speed_items=p.speed_items,
                   load=_load(p, where), exactness_reference=p.exactness_reference, top_k=p.top_k or 0)
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


def _engine(name: str, t: schema.Engine, where: str):
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


def _check_engines(baseline: DecoderSpec, candidates: tuple, engines: dict, prof: Profile, path: Path) -> None:
    """Every engine a decoder or the profile names is defined, and the A/A run runs the baseline's model."""
    where, known = f"{path} [profiles.{prof.name}]", f"defined: {', '.join(sorted(engines)) or 'none'}"
    if "aa_engine" in baseline.options and "engine" not in baseline.options:
        raise ConfigError(f"{path} [baseline]: aa_engine (where the A/A run goes) needs an engine baseline")
    for spec, name in [(s, s.options.get(k)) for s in (baseline, *candidates) for k in ("engine", "aa_engine")]:
        if name is not None and name not in engines:
            raise ConfigError(f"{path}: {spec.name!r} names engine {name!r}{_hint(name, engines)}, which no "
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


def load_config(path: str | Path, profile: str = "smoke") -> RegressConfig:
    path = Path(path)
    raw = _read(path)
    try:
        doc = schema.Regress.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(schema.explain(e, raw, str(path))) from None
    baseline = _decoder(doc.baseline or schema.Decoder(decoder="standard", name="baseline"), f"{path} [baseline]")
    candidates = tuple(_decoder(c, f"{path} [[candidates]] #{i + 1}") for i, c in enumerate(doc.candidates))
    if not candidates:
        raise ConfigError(f"{path}: no [[candidates]] to compare with the baseline")
    for spec in (baseline, *candidates):
        _check_option_names(spec, str(path))
    names = [baseline.name] + [c.name for c in candidates]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"{path}: decoder names must be unique; repeated: {', '.join(sorted(dupes))}")
    suites = {name: _suite(name, t, path) for name, t in doc.suites.items()}
    if profile not in doc.profiles:
        raise ConfigError(f"{path}: unknown profile {profile!r}; defined: {', '.join(sorted(doc.profiles)) or 'none'}")
    prof, candidates = _profile(profile, doc.profiles[profile], suites, candidates, f"{path} [profiles.{profile}]")
    for c in candidates:
        for s in c.suites or ():
            if s not in prof.suites:
                raise ConfigError(f"{path}: candidate {c.name!r} lists suite {s!r}{_hint(s, prof.suites)}, "
                                  f"which profile {profile!r} does not run")
    engines = {name: _engine(name, t, f"{path} [engines.{name}]") for name, t in doc.engines.items()}
    _check_engines(baseline, candidates, engines, prof, path)
    for label in [*doc.labels, *(k for c in candidates for k in c.labels)]:
        if not all(ch.isalnum() or ch in "_-./ " for ch in label):
            raise ConfigError(f"{path}: label name {label!r} may hold only letters, digits and _ - . / space")
    if not prof.suites:  # a run of no prompts gates nothing: refused now, not a FAIL after the models load
        raise ConfigError(f"{path} [profiles.{profile}]: suites is empty; name at least one suite (shipped: "
                          f"factual, code, refusal, longform, humaneval; or a [suites.NAME] table with a path)")
    gates = doc.gates.model_dump() | {"near_tie_epsilon": None if doc.gates.near_tie_epsilon == "auto"
                                      else doc.gates.near_tie_epsilon}
    return RegressConfig(path=str(path), target=doc.target, device=doc.device, chat=doc.chat, top_p=float(doc.top_p),
                         baseline=baseline, candidates=candidates, suites=suites, profile=prof, gates=Gates(**gates),
                         labels=dict(doc.labels), engines=engines, log_text=doc.log_text, trace_limit=doc.trace_limit)
