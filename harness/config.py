"""The regress config (TOML): target, baseline, candidates, suites, profiles, seeds, gates.

See `regress.toml` at the repo root for the documented default. Everything is validated on load
so that a typo fails in a second with the key named, not after an hour of generation.
"""
from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from decoders.base import seed_problem, temperature_problem


class ConfigError(ValueError):
    """A regress config that cannot be used as written."""


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
    # A run folder or "mlflow:last" whose α/τ this candidate must not fall below (harness.verdict.acceptance_ref),
    # and the relative drop tolerated (default 0.05).
    acceptance_reference: str | None = None
    acceptance_tolerance: float | None = None


# Decoders that sample with the keyed noise of `standard`, so sampled outputs can be identical.
# transformers' peers sample from torch's global generator: only their greedy output can match.
KEYED_NOISE = ("standard", "early-exit")


def sampled_identity_applies(decoder: str, options: dict) -> bool:
    """Whether an exact decoder's *sampled* output must match the baseline token for token."""
    if decoder == "speculative":
        # Rejection sampling is exact in distribution only; its sampled outputs may differ by design.
        return (options or {}).get("verify") == "coupled"
    return decoder in KEYED_NOISE


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    margin: float | None = None     # non-inferiority margin on the pass rate; None: no quality gate
    path: str | None = None         # a suite file of one's own (default: the shipped suite NAME)
    # For "lmeval:<task>" suites: a folder of local task YAMLs, and how many samples to take.
    include_path: str | None = None
    limit: int | None = None
    max_gen_toks: int | None = None
    discordance: float | None = None  # planning: the share of pairs expected to disagree (default [gates])
    allow_code: bool = False        # "lmeval:<task>": may run a task that executes generated code


@dataclass(frozen=True)
class Slo:
    """Latency objectives per load level (seconds; None: not set), gated where the baseline meets them."""
    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    e2e_p95_s: float | None = None

    def items(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Load:
    """Open-loop load (harness.run.load): requests arrive at `rates` per second on a seeded schedule."""
    rates: tuple[float, ...]
    burstiness: float = 1.0          # gamma shape of the gaps; 1: Poisson, < 1 burstier, > 1 more regular
    max_in_flight: int | None = None  # a cap on requests in flight (None: none)
    requests: int = 60               # requests per level (59 is the least with a 95% upper bound on a p95)
    seed: int = 0
    refine_levels: int = 2           # extra levels spent bracketing each crossover
    slo: Slo = Slo()
    client_workers: int | None = None  # load client processes (None: as the measured cost needs, at most the cores)


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
    # Baseline generations timed afresh beside the candidates when the rest comes from the store
    # (speed is compared on these only; quality and identity on all rows).
    speed_items: int = 30
    load: Load | None = None           # open-loop arrival rates, SLOs (None: no load phase)
    # What an exact engine candidate's sampled tokens are tested against (harness.run.engine_exactness):
    # "target" (the harness's own copy of the weights, teacher-forced) or "engine:NAME" (that
    # engine's own logprobs over the candidate's output).
    exactness_reference: str = "target"
    # The top-k cut at sampling temperatures (0: none). Every decoder gets it in its request;
    # engines pass it on (vLLM/OpenAI `top_k`, llama.cpp `top_k`), in-process samplers apply it.
    top_k: int = 0


LOAD_KEYS = {"rates", "burstiness", "max_in_flight", "load_requests", "load_seed", "refine_levels", "slo",
             "client_workers"}


def _load(p: dict, where: str) -> Load | None:
    """A profile's open-loop keys -> Load (None when it has no `rates`)."""
    if "rates" not in p:
        extra = sorted(set(p) & (LOAD_KEYS - {"rates"}))
        if extra:
            raise ConfigError(f"{where}: {', '.join(extra)} need rates = [...] (requests per second)")
        return None
    rates = p["rates"]
    if not isinstance(rates, list) or not rates or len(set(rates)) != len(rates) or not all(
            isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in rates):
        raise ConfigError(f"{where}: rates must be a list of distinct request rates > 0 (per second), e.g. [0.5, 1, 2]")
    _number(p, "burstiness", 0.0, float("inf"), where, "a positive gamma shape (1: Poisson)")
    for key, low in (("max_in_flight", 1), ("load_requests", 1), ("load_seed", 0), ("refine_levels", 0),
                     ("client_workers", 1)):
        v = p.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
            raise ConfigError(f"{where}: {key} must be an integer >= {low}, got {v!r}")
    slo = p.get("slo", {})
    if not isinstance(slo, dict):
        raise ConfigError(f"{where}: slo must be a table of ttft_p95_s, tpot_p95_s, e2e_p95_s")
    _take(slo, {"ttft_p95_s", "tpot_p95_s", "e2e_p95_s"}, f"{where} slo")
    for key in slo:
        _number(slo, key, 0.0, float("inf"), f"{where} slo", "a positive number of seconds")
    return Load(rates=tuple(sorted(float(r) for r in rates)), burstiness=float(p.get("burstiness", 1.0)),
                max_in_flight=p.get("max_in_flight"), requests=p.get("load_requests", 60), seed=p.get("load_seed", 0),
                refine_levels=p.get("refine_levels", 2), slo=Slo(**{k: float(v) for k, v in slo.items()}),
                client_workers=p.get("client_workers"))


@dataclass(frozen=True)
class Gates:
    alpha: float = 0.05             # level of each one-sided test (non-inferiority, loss, speed bound)
    # A divergence where the baseline's top-2 margin is below this is a tie; None ("auto"): from
    # the target's dtype and the measured margin noise (analysis.identity.near_tie_epsilon).
    near_tie_epsilon: float | None = None
    exactness_pvalue: float = 0.01  # family-wise level of a candidate's exactness checks (Bonferroni)
    inconclusive: str = "fail"      # a comparison that shows neither pass nor failure: "fail" or "warn"
    spending: str = "obrien-fleming"  # alpha spending across a profile's looks (analysis.sequential)
    discordance: float = 0.2        # planning value of the discordant share, where no run observed it
    # The A/A run is a floor only while it looks like noise (harness.verdict.floor): it diverges on at
    # most this share of prompts, and moves the engine's top-2 margins by at most aa_noise_max logits.
    aa_floor_max: float = 0.25
    aa_noise_max: float = 1.0
    # An exact candidate's divergences within the A/A noise pass when its per-prompt divergence rate
    # is shown to exceed the A/A run's by less than this (Tango non-inferiority at alpha).
    aa_excess_tolerance: float = 0.10


class ConfigWarning(UserWarning):
    """A config that runs, but whose checks cannot see something (e.g. one sampling seed)."""


ENGINE_KEYS = {"base_url", "launch", "model", "health_timeout_s", "request_timeout_s", "retries", "concurrency",
               "api_key_env", "env", "reuse_baseline"}


def _engine(name: str, table: dict, where: str):
    """An [engines.NAME] table -> EngineSpec. Secrets never sit in the config: `api_key_env`
    names the environment variable that holds the key."""
    import os
    import shlex
    from decoders.engines.server import EngineSpec
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, got {table!r}")
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: engine name {name!r} may hold only letters, digits and _ . - + = (it names "
                          f"the engine's log file)")
    _take(table, ENGINE_KEYS, where)
    if bool(table.get("base_url")) == bool(table.get("launch")):
        raise ConfigError(f"{where}: give exactly one of base_url (an engine already running) "
                          f"or launch (a command decodegate starts)")
    launch = table.get("launch")
    if isinstance(launch, str):
        launch = shlex.split(launch)
    if launch is not None and not (isinstance(launch, list) and launch and all(isinstance(a, str) for a in launch)):
        raise ConfigError(f"{where}: launch must be a command: a string or a list of strings")
    if launch is not None and not any("{port}" in a for a in launch):
        raise ConfigError(f"{where}: launch must contain {{port}} (decodegate picks a free port)")
    for key in ("base_url", "model", "api_key_env"):
        _typed(table, key, str, where, "a string")
    env = _table(table, "env", where)
    if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in env.values()):
        raise ConfigError(f"{where}: env must be a table of NAME = \"value\" strings, got {env!r}")
    for key in ("health_timeout_s", "request_timeout_s"):
        if key in table and (isinstance(table[key], bool) or not isinstance(table[key], (int, float))
                             or table[key] <= 0):
            raise ConfigError(f"{where}: {key} must be a positive number of seconds")
    for key, low in (("retries", 0), ("concurrency", 1)):
        if key in table and (not isinstance(table[key], int) or isinstance(table[key], bool) or table[key] < low):
            raise ConfigError(f"{where}: {key} must be an integer >= {low}, got {table[key]!r}")
    if "reuse_baseline" in table:
        # A URL does not identify the deployment behind it: its baseline rows are reused only
        # where the config vouches that it is pinned (harness.run.reuse).
        if not isinstance(table["reuse_baseline"], bool):
            raise ConfigError(f"{where}: reuse_baseline must be true or false, got {table['reuse_baseline']!r}")
        if table.get("launch"):
            raise ConfigError(f"{where}: reuse_baseline is for a base_url engine; a launched engine is keyed "
                              f"by its command, files and environment, and reused without it")
    key_env = table.get("api_key_env")
    if key_env and key_env not in os.environ:
        raise ConfigError(f"{where}: api_key_env names ${key_env}, which is not set")
    kw = {k: table[k] for k in ("base_url", "model", "health_timeout_s", "request_timeout_s", "retries", "concurrency",
                                "reuse_baseline") if k in table}
    return EngineSpec(name=name, launch=tuple(launch) if launch else None,
                      api_key=os.environ.get(key_env) if key_env else None,
                      env={str(k): str(v) for k, v in table.get("env", {}).items()}, **kw)


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
    log_text: bool = True           # false: generated text stays in the run folder, never goes to MLflow
    trace_limit: int = 100          # MLflow traces per decoder and run, divergent prompts first (0: none)


KINDS = ("exact", "lossy")
AS_LOGGED = "as-logged"  # profile temperatures: each suite item's logged sampling settings


def _take(table: dict, allowed: set, where: str) -> dict:
    unknown = set(table) - allowed
    if unknown:
        key = sorted(unknown)[0]
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(sorted(allowed))}")
    return table


def _typed(table: dict, key: str, types, where: str, what: str):
    types = types if isinstance(types, tuple) else (types,)
    # bool is an int to Python: `min_speedup = true` must not pass as the number 1.
    if key in table and (not isinstance(table[key], types) or (isinstance(table[key], bool) and bool not in types)):
        raise ConfigError(f"{where}: {key!r} must be {what}, got {table[key]!r}")


def _table(table: dict, key: str, where: str) -> dict:
    """table[key] as a table ({} when absent): a list or a number where a table goes is named here,
    not met later as an AttributeError deep in the loader."""
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a table ([{key}] or {key} = {{ ... }}), got {value!r}")
    return value


def _names(table: dict, key: str, where: str) -> None:
    """A list of names (suites of a profile): strings, none repeated."""
    names = table.get(key)
    if names is None:
        return
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigError(f"{where}: {key} must be a list of names (strings), got {names!r}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{where}: {key} names {', '.join(repeated)} more than once")


# A decoder's or an engine's name becomes a folder (figures/NAME, engines' logs), an MLflow run name
# and search filter, a JUnit class name and a Markdown cell: no path separators, quotes, markup or
# control characters. '@' and '~' are left out too: the harness derives names with them (spec@c4,
# base~aa).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,79}")


def _decoder(table: dict, where: str, default_kind: str) -> DecoderSpec:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, got {table!r}")
    _take(table, {"name", "decoder", "options", "kind", "target", "min_speedup", "labels", "suites",
                  "acceptance_reference", "acceptance_tolerance"}, where)
    if "decoder" not in table:
        raise ConfigError(f"{where}: missing key 'decoder'")
    for key, types, what in [("name", str, "a string"), ("decoder", str, "a string"), ("options", dict, "a table"),
                             ("target", str, "a model name"), ("min_speedup", (int, float), "a number"),
                             ("labels", dict, "a table"), ("suites", list, "a list of suite names"),
                             ("acceptance_reference", str, 'a run folder or "mlflow:last"')]:
        _typed(table, key, types, where, what)
    _number(table, "acceptance_tolerance", -1e-300, 1.0, where, "a relative drop in [0, 1), e.g. 0.05")
    if "acceptance_tolerance" in table and "acceptance_reference" not in table:
        raise ConfigError(f"{where}: acceptance_tolerance needs an acceptance_reference")
    if "verify" in table.get("options", {}) and table["decoder"] != "speculative":
        raise ConfigError(f"{where}: option 'verify' applies to the speculative decoder only")
    # Without a name, the decoder's own ("module:Class" for a team's decoder, made a name).
    name = str(table["name"]) if "name" in table else (
        re.sub(r"[^A-Za-z0-9_.+=-]", "-", table["decoder"]).lstrip("_.+=-")[:80] or "decoder")
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: name {name!r} may hold only letters, digits and _ . - + = (at most 80, "
                          f"starting with a letter or digit): it names folders, MLflow runs and JUnit cases")
    kind = table.get("kind", default_kind)
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {KINDS}, got {kind!r}")
    options = dict(table.get("options", {}))
    if table["decoder"] == "speculative" and "verify" not in options:
        # Make the sampled verifier explicit, so gates and tags never guess the decoder's default.
        from decoders.speculative import DEFAULT_VERIFIER
        options["verify"] = DEFAULT_VERIFIER
    return DecoderSpec(name=name, decoder=table["decoder"],
                       options=options, kind=kind, target=table.get("target"),
                       min_speedup=table.get("min_speedup"), labels=dict(table.get("labels", {})),
                       suites=tuple(table["suites"]) if "suites" in table else None,
                       acceptance_reference=table.get("acceptance_reference"),
                       acceptance_tolerance=table.get("acceptance_tolerance"))


# In-process decoders: every option is a named parameter of the class, the rest refused
# (decoders.common.reject_options). Engines and a team's own classes check their own.
IN_PROCESS = ("standard", "speculative", "early-exit", "hf", "hf-assisted")


def _check_option_names(spec: DecoderSpec, where: str) -> None:
    """A misspelt option named with the closest valid one, before any model loads (the decoder
    itself refuses it too, but only once the models are loaded, and without the hint)."""
    if spec.decoder not in IN_PROCESS:
        return
    import inspect
    from decoders import get_decoder_class
    params = inspect.signature(get_decoder_class(spec.decoder).__init__).parameters.values()
    allowed = {p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD or p.kind is p.KEYWORD_ONLY} - {
        "self", "target"}
    if "draft" in allowed:
        allowed.add("draft_device")  # taken by harness.build, which places a draft model
    unknown = sorted(set(spec.options) - allowed)
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: {spec.name!r} (decoder {spec.decoder!r}): takes no option(s) "
                          f"{', '.join(unknown)}{hint}; its options: {', '.join(sorted(allowed))}")


def _number(table: dict, key: str, low: float, high: float, where: str, what: str) -> None:
    v = table.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not low < v < high):
        raise ConfigError(f"{where}: {key} must be {what}, got {v!r}")


def _gates(table: dict, where: str) -> Gates:
    g = dict(_take(table, {"alpha", "near_tie_epsilon", "exactness_pvalue", "inconclusive", "spending",
                           "discordance", "aa_floor_max", "aa_noise_max",
                           "aa_excess_tolerance"}, where))
    _number(g, "alpha", 0.0, 0.5, where, "a level in (0, 0.5)")
    _number(g, "aa_floor_max", -1e-300, 1.0 + 1e-12, where, "a share of prompts in [0, 1]")
    _number(g, "aa_noise_max", 0.0, float("inf"), where, "a positive number of logits")
    _number(g, "aa_excess_tolerance", 0.0, 1.0, where, "a share of prompts in (0, 1)")
    _number(g, "exactness_pvalue", 0.0, 0.5, where, "a level in (0, 0.5)")
    _number(g, "discordance", 0.0, 1.0 + 1e-12, where, "a share of pairs in (0, 1]")
    if g.get("near_tie_epsilon") == "auto":
        g["near_tie_epsilon"] = None
    _number(g, "near_tie_epsilon", -1e-300, float("inf"), where, '"auto" or a number >= 0')
    gates = Gates(**g)
    if gates.inconclusive not in ("fail", "warn"):
        raise ConfigError(f"{where}: inconclusive must be 'fail' or 'warn'")
    from analysis.sequential import SPENDING
    if gates.spending not in SPENDING:
        raise ConfigError(f"{where}: spending must be one of {', '.join(SPENDING)}, got {gates.spending!r}")
    return gates


def _check_seeds(prof: Profile, where: str) -> None:
    """A sampled identity check at one seed cannot see a decoder that ignores the seed; at seed 0
    alone it cannot see one that always uses 0."""
    import warnings
    sampled = any(t > 0 for t in prof.temperatures) and prof.sample_suites
    if sampled and (len(prof.seeds) < 2 or all(s == 0 for s in prof.seeds)):
        warnings.warn(f"{where}: seeds {list(prof.seeds)}: sampled checks need at least two seeds, one of them "
                      f"not 0 (a decoder that ignores the request's seed passes at one)", ConfigWarning, stacklevel=3)


def load_config(path: str | Path, profile: str = "smoke") -> RegressConfig:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder; give the TOML file, e.g. {path / 'regress.toml'}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))  # TOML is UTF-8, whatever the locale says
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 (byte 0x{e.object[e.start]:02x} on line {line}); TOML files are "
                          f"UTF-8") from None
    _take(raw, {"target", "device", "chat", "top_p", "baseline", "candidates", "suites", "profiles",
                "gates", "labels", "engines", "log_text", "trace_limit"}, str(path))
    _typed(raw, "log_text", bool, str(path), "true or false")
    if "trace_limit" in raw and (not isinstance(raw["trace_limit"], int) or isinstance(raw["trace_limit"], bool)
                                 or raw["trace_limit"] < 0):
        raise ConfigError(f"{path}: trace_limit must be an integer >= 0 (traces per decoder; 0: none), "
                          f"got {raw['trace_limit']!r}")
    if "target" not in raw:
        raise ConfigError(f"{path}: missing key 'target'")
    if not isinstance(raw["target"], str) or not raw["target"].strip():
        raise ConfigError(f"{path}: target must be a model name (an alias, a folder, a .gguf file or a Hugging Face "
                          f"id), got {raw['target']!r}")
    # chat = "false" is a true string: it would apply the chat template it names off.
    _typed(raw, "chat", bool, str(path), "true or false (default: the model's chat template when it has one)")
    for key in ("suites", "profiles", "gates", "labels", "engines"):
        _table(raw, key, str(path))
    baseline = _decoder(raw.get("baseline", {"decoder": "standard", "name": "baseline"}), f"{path} [baseline]", "exact")
    candidates = tuple(_decoder(c, f"{path} [[candidates]] #{i + 1}", "exact")
                       for i, c in enumerate(raw.get("candidates", [])))
    if not candidates:
        raise ConfigError(f"{path}: no [[candidates]] to compare with the baseline")
    for spec in (baseline, *candidates):
        _check_option_names(spec, str(path))
    names = [baseline.name] + [c.name for c in candidates]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"{path}: decoder names must be unique; repeated: {', '.join(sorted(dupes))}")
    suites = {}
    for name, table in raw.get("suites", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path} [suites.{name}]: must be a table (margin, path, ...), got {table!r}")
        _take(table, {"margin", "path", "include_path", "limit", "max_gen_toks", "discordance", "allow_code"},
              f"{path} [suites.{name}]")
        if not isinstance(table.get("allow_code", False), bool):
            raise ConfigError(f"{path} [suites.{name}]: allow_code must be true or false, got {table['allow_code']!r}")
        if "allow_code" in table and not name.startswith("lmeval:"):
            raise ConfigError(f"{path} [suites.{name}]: allow_code applies to lmeval:<task> suites only")
        _number(table, "margin", 0.0, 1.0 + 1e-12, f"{path} [suites.{name}]", "a drop in pass rate in (0, 1]")
        _number(table, "discordance", 0.0, 1.0 + 1e-12, f"{path} [suites.{name}]", "a share of pairs in (0, 1]")
        file, include = table.get("path"), table.get("include_path")
        for key in ("path", "include_path"):
            if table.get(key) is not None and (not isinstance(table[key], str) or not table[key].strip()):
                raise ConfigError(f"{path} [suites.{name}]: {key} must be a non-empty string, got {table[key]!r}")
        # A suite file relative to the config file; "hf:DATASET[@split]" is a dataset, not a file.
        if file is not None and not file.startswith("hf:") and not Path(file).is_absolute():
            file = str(path.parent / file)
        if include is not None and not Path(include).is_absolute():
            include = str(path.parent / include)
        if (include or table.get("limit") is not None or table.get("max_gen_toks") is not None) \
                and not name.startswith("lmeval:"):
            raise ConfigError(f"{path} [suites.{name}]: include_path/limit/max_gen_toks apply to lmeval:<task> suites only")
        for key in ("limit", "max_gen_toks"):  # lm-eval suites run last: a bad value would surface hours in
            v = table.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"{path} [suites.{name}]: {key} must be an integer >= 1, got {v!r}")
        suites[name] = SuiteSpec(name, table.get("margin"), file, include, table.get("limit"), table.get("max_gen_toks"),
                                 table.get("discordance"), allow_code=table.get("allow_code", False))
    profiles = raw.get("profiles", {})
    if profile not in profiles:
        raise ConfigError(f"{path}: unknown profile {profile!r}; defined: {', '.join(sorted(profiles)) or 'none'}")
    if not isinstance(profiles[profile], dict):
        raise ConfigError(f"{path} [profiles.{profile}]: must be a table (subset, suites, ...), "
                          f"got {profiles[profile]!r}")
    p = _take(profiles[profile], {"subset", "suites", "temperatures", "sample_suites", "seeds", "max_new_tokens",
                                  "exactness_prompts", "exactness_samples", "exactness_reference", "concurrency", "looks",
                                  "speed_items", "candidates", "top_k", *LOAD_KEYS}, f"{path} [profiles.{profile}]")
    where = f"{path} [profiles.{profile}]"
    for key in ("suites", "sample_suites"):
        _names(p, key, where)
    suite_names = tuple(p.get("suites", list(suites)))
    for s in suite_names:
        suites.setdefault(s, SuiteSpec(s))
    as_logged = p.get("temperatures") == AS_LOGGED
    if as_logged:
        p = {k: v for k, v in p.items() if k != "temperatures"} | {"temperatures": []}
    for key in ("suites", "temperatures", "sample_suites", "seeds"):
        _typed(p, key, list, where, "a list" + (' (or "as-logged")' if key == "temperatures" else ""))
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in p.get("temperatures", [])):
        raise ConfigError(f"{where}: temperatures must be numbers (0 is greedy), got {p['temperatures']!r}")
    temps = tuple(float(t) for t in p.get("temperatures", [0.0]))
    for t in temps:  # the requests' own rule (decoders.base), said here before any model loads
        if temperature_problem(t):
            raise ConfigError(f"{where}: temperatures: {temperature_problem(t)}")
    if len(set(temps)) != len(temps) or len(set(p.get("seeds", [0]))) != len(p.get("seeds", [0])):
        raise ConfigError(f"{where}: temperatures and seeds must not repeat")
    if not p.get("seeds", [0]) or not all(isinstance(x, int) and not isinstance(x, bool) for x in p.get("seeds", [0])):
        raise ConfigError(f"{where}: seeds must be a non-empty list of integers")
    for x in p.get("seeds", [0]):
        if seed_problem(x):
            raise ConfigError(f"{where}: seeds: {seed_problem(x)}")
    unknown = set(p.get("sample_suites", [])) - set(p.get("suites", list(suites)))
    if unknown:
        raise ConfigError(f"{where}: sample_suites {sorted(unknown)} are not in this profile's suites")
    if p.get("max_new_tokens") is not None and (not isinstance(p["max_new_tokens"], int)
                                                 or isinstance(p["max_new_tokens"], bool) or p["max_new_tokens"] < 1):
        raise ConfigError(f"{where}: max_new_tokens must be a positive integer")
    levels = p.get("concurrency", [])
    if isinstance(levels, int) and not isinstance(levels, bool):
        levels = [levels]
    if not isinstance(levels, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in levels) \
            or len(set(levels)) != len(levels):
        raise ConfigError(f"{where}: concurrency must be a list of distinct integers >= 1, e.g. [1, 4, 16]")
    for key, low in (("looks", 1), ("speed_items", 0), ("exactness_prompts", 0), ("exactness_samples", 1)):
        v = p.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
            raise ConfigError(f"{where}: {key} must be an integer >= {low}, got {v!r}")
    top_k = p.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ConfigError(f"{where}: top_k must be an integer >= 1 (leave it out for no top-k cut), got {top_k!r}")
    if "candidates" in p:
        _typed(p, "candidates", list, where, "a list of candidate names")
        known = [c.name for c in candidates]
        for n in p["candidates"]:
            if n not in known:
                close = difflib.get_close_matches(str(n), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{where}: candidates names {n!r}{hint}, which no [[candidates]] defines")
        candidates = tuple(c for c in candidates if c.name in p["candidates"])
        if not candidates:  # a run of the baseline alone would gate nothing and exit 0
            raise ConfigError(f"{where}: candidates = [] selects no candidate; name at least one of "
                              f"{', '.join(known)}, or leave the key out to run them all")
    prof = Profile(name=profile, subset=p.get("subset", profile), suites=suite_names, temperatures=temps,
                   sample_suites=tuple(p.get("sample_suites", suite_names)), seeds=tuple(p.get("seeds", [0])),
                   max_new_tokens=p.get("max_new_tokens"), exactness_prompts=int(p.get("exactness_prompts", 2)),
                   exactness_samples=int(p.get("exactness_samples", 200)), concurrency=tuple(levels),
                   as_logged=as_logged, looks=p.get("looks", 1), speed_items=p.get("speed_items", 30),
                   load=_load(p, where), exactness_reference=p.get("exactness_reference", "target"),
                   top_k=top_k or 0)
    if prof.subset not in ("smoke", "full"):
        raise ConfigError(f"{path} [profiles.{profile}]: subset must be 'smoke' or 'full'")
    gates = _gates(raw.get("gates", {}), f"{path} [gates]")
    _check_seeds(prof, where)
    top_p = raw.get("top_p", 1.0)
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ConfigError(f"{path}: top_p must be in (0, 1], got {top_p!r}")
    for c in candidates:
        for s_name in c.suites or ():
            if s_name not in suite_names:
                close = difflib.get_close_matches(s_name, suite_names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{path}: candidate {c.name!r} lists suite {s_name!r}{hint}, "
                                  f"which profile {profile!r} does not run")
    engines = {name: _engine(name, table, f"{path} [engines.{name}]") for name, table in raw.get("engines", {}).items()}
    if "aa_engine" in baseline.options and "engine" not in baseline.options:
        raise ConfigError(f"{path} [baseline]: aa_engine (where the A/A run goes) needs an engine baseline")
    for spec, name in [(s, s.options.get(k)) for s in (baseline, *candidates) for k in ("engine", "aa_engine")]:
        if name is not None and name not in engines:
            close = difflib.get_close_matches(str(name), engines, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{path}: {spec.name!r} names engine {name!r}{hint}, which no [engines.NAME] "
                              f"table defines (defined: {', '.join(sorted(engines)) or 'none'})")
    aa, own = baseline.options.get("aa_engine"), baseline.options.get("engine")
    if aa is not None and engines[aa].model and engines[own].model and engines[aa].model != engines[own].model:
        # The A/A run is the baseline's noise floor: on another model it measures that model's
        # disagreement, and excuses a candidate's divergences up to it.
        raise ConfigError(f"{path} [baseline]: aa_engine {aa!r} serves model {engines[aa].model!r}, the baseline's "
                          f"engine {own!r} serves {engines[own].model!r}: the A/A run must run the baseline's model")
    ref = prof.exactness_reference
    if not isinstance(ref, str) or not (ref == "target" or ref.startswith("engine:")):
        raise ConfigError(f'{where}: exactness_reference must be "target" or "engine:NAME", got {ref!r}')
    if ref.startswith("engine:") and ref[len("engine:"):] not in engines:
        raise ConfigError(f"{where}: exactness_reference names engine {ref[len('engine:'):]!r}, which no "
                          f"[engines.NAME] table defines (defined: {', '.join(sorted(engines)) or 'none'})")
    if prof.load is not None and not (isinstance(baseline.options.get("engine"), str)
                                      and any(isinstance(c.options.get("engine"), str) for c in candidates)):
        # Open-loop arrivals need a server that queues and batches; in-process decoders are batch-1.
        raise ConfigError(f"{where}: rates (open-loop load) need an engine baseline and at least one engine "
                          f"candidate (options = {{ engine = \"NAME\" }})")
    device = raw.get("device")
    if device is not None and not (isinstance(device, str) and re.fullmatch(r"cpu|mps|cuda(:\d+)?", device)):
        raise ConfigError(f"{path}: device must be \"cpu\", \"cuda\", \"cuda:N\" or \"mps\", got {device!r}")
    for label in [*raw.get("labels", {}), *(k for c in candidates for k in c.labels)]:
        if not all(ch.isalnum() or ch in "_-./ " for ch in label):
            raise ConfigError(f"{path}: label name {label!r} may hold only letters, digits and _ - . / space")
    if not suite_names:  # a run of no prompts gates nothing: refused now, not a FAIL after the models load;
        # last, so that a value's own error (top_p, a gate) is named first
        raise ConfigError(f"{where}: suites is empty; name at least one suite (shipped: factual, code, refusal, "
                          f"longform, humaneval; or a [suites.NAME] table with a path)")
    return RegressConfig(path=str(path), target=raw["target"], device=raw.get("device"), chat=raw.get("chat"),
                         top_p=float(raw.get("top_p", 1.0)), baseline=baseline, candidates=candidates,
                         suites=suites, profile=prof, gates=gates, labels=dict(raw.get("labels", {})),
                         engines=engines, log_text=raw.get("log_text", True),
                         trace_limit=raw.get("trace_limit", 100))
