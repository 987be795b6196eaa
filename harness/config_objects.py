"""The objects a regress config resolves into (harness.config loads them; everything else reads
them): decoder specs, suites, the profile, load and SLOs, gates, the whole config. Slo and Gates
are made from their schema tables (harness.config_schema), so their fields and defaults are
declared once."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

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
