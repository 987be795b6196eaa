"""The regress config's TOML shape, declared once: every key, its type, range, default and one
line of meaning. harness.config validates a file against these models and resolves it into the
objects the run uses; `decodegate config-schema` prints their JSON Schema (which editors use to
check a TOML file as it is typed); `make docs` writes docs/configuration.md's key tables from them.

A key is one line in its table's class: `name: Annotated[type, Must("what it must be")] =
Field(default, description="meaning", ge=..., ...)`. `Must` is the phrase of the error message
("KEY must be WHAT, got VALUE"); without it the phrase is derived from the type and range.
Rules across keys (one of base_url or launch, a suite a profile runs, ...) live in harness.config.
"""
from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

SCHEMA_ID = "https://decodegate.invalid/regress.schema.json"
# analysis.sequential.SPENDING (its import costs seconds; tests/test_config_schema.py checks they agree)
SPENDING = ("obrien-fleming", "pocock")
SCHEMA_FILE = "regress.schema.json"  # at the repo root, where the shipped configs' #:schema points


class Must:
    """The error phrase of a key; `quote`: the key is written quoted ('chat' must be ...)."""

    def __init__(self, text: str, quote: bool = False):
        self.text, self.quote = text, quote


class Table(BaseModel):
    # strict: 1 is not true, "1" is not 1; unknown keys are refused (with the closest name).
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


NUM = Annotated[float, Field(allow_inf_nan=True)]  # the caller names inf/nan in its own words
SEED = Annotated[int, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 2 ** 63 - 1})]


class Decoder(Table):
    decoder: Annotated[str, Must("a string", True)] = Field(
        description='required: a built-in decoder (below), an engine protocol, or "package.module:Class"')
    name: Annotated[str, Must("a string", True)] = Field(
        None,
        description="label in records, reports and MLflow (default: the decoder's name); names must be unique and "
                    "hold only letters, digits and _ . - + = (they name folders, MLflow runs and JUnit cases)")
    options: Annotated[dict[str, Any], Must("a table", True)] = Field(
        {},
        description="the decoder's options, a table (e.g. { draft = \"prompt-lookup\", k = 4, verify = \"coupled\" }); "
                    "an unknown option of a built-in decoder is refused with the closest name")
    kind: Literal["exact", "lossy"] = Field(
        "exact", description="\"exact\" (outputs must not move) or \"lossy\" (may move within each suite's margin)")
    target: Annotated[str, Must("a model name", True)] = Field(
        None, description="another target for this candidate (e.g. the quantized sibling smollm2-135m-int8)")
    min_speedup: Annotated[float, Must("a number", True)] = Field(
        None, description="the speed gate, on the one-sided lower bound of the speedup")
    labels: Annotated[dict[str, Any], Must("a table", True)] = Field(
        {}, description="per-candidate labels, copied to MLflow tags")
    suites: Annotated[list[str], Must("a list of suite names", True)] = Field(
        None, description="run this candidate only on these suites of the profile (default: all)")
    acceptance_reference: Annotated[str, Must('a run folder or "mlflow:last"', True)] = Field(
        None, description='a run folder or "mlflow:last" whose α and τ this candidate must not fall below')
    acceptance_tolerance: Annotated[float, Must("a relative drop in [0, 1), e.g. 0.05")] = Field(
        None, ge=0, lt=1, description="the relative drop tolerated against that reference (default 0.05)")


class Suite(Table):
    margin: Annotated[float, Must("a drop in pass rate in (0, 1]")] = Field(
        None, gt=0, le=1,
        description="the non-inferiority margin: the largest drop in pass rate (absolute, in (0, 1]) a candidate may"
                    " show; a suite without one is not gated on quality (longform has no right answer)")
    path: Annotated[str, Must("a non-empty string")] = Field(
        None, min_length=1, pattern=r"\S",
        description="a suite file of your own (default: the shipped suite NAME), relative to the config file; or "
                    "hf:DATASET[@split] (a Hugging Face dataset or a local folder, left as written). A suite is "
                    "validated when it loads: item ids unique, grader options typed and sane, each error naming the "
                    "item")
    discordance: Annotated[float, Must("a share of pairs in (0, 1]")] = Field(
        None, gt=0, le=1,
        description="planning value for the sample size: the share of pairs expected to disagree (default [gates] "
                    "discordance)")
    include_path: Annotated[str, Must("a non-empty string")] = Field(
        None, min_length=1, pattern=r"\S", description="lmeval:TASK suites: a folder of local task YAMLs")
    limit: int = Field(None, ge=1, description="lmeval:TASK suites: how many samples")
    max_gen_toks: int = Field(None, ge=1, description="lmeval:TASK suites: the generation cap")
    allow_code: bool = Field(False,
    description="lmeval:TASK suites only: true lets a task that executes the model's generated code (lm-eval's "
                "unsafe_code) run; without it such a task is refused before the run starts")


class Slo(Table):
    ttft_p95_s: Annotated[float, Must("a positive number of seconds")] = Field(
        None, gt=0, description="p95 time to first token objective, seconds")
    tpot_p95_s: Annotated[float, Must("a positive number of seconds")] = Field(
        None, gt=0, description="p95 time per output token objective, seconds")
    e2e_p95_s: Annotated[float, Must("a positive number of seconds")] = Field(
        None, gt=0, description="p95 end-to-end latency objective, seconds")


class Profile(Table):
    subset: Literal["smoke", "full"] = Field(
        None,
        description="\"smoke\" (each suite's documented smoke subset) or \"full\" (every item); default: the profile's "
                    "name, which must then be one of them")
    suites: Annotated[list[str], Must("a list of names (strings)")] = Field(
        None, description="the suites this profile runs (default: all that are declared)")
    candidates: Annotated[list[str], Must("a list of candidate names", True)] = Field(
        None,
        description="run only these candidates (default: all; an empty list is refused: a run of the baseline alone "
                    "would gate nothing)")
    temperatures: Annotated[list[NUM] | Literal["as-logged"], Must("numbers (0 is greedy)")] = Field(
        [0.0],
        description="distinct, 0 (greedy) or >= 1e-6 (below that, logits / T overflow); or \"as-logged\" (each item's "
                    "own logged sampling, for imported suites)")
    sample_suites: Annotated[list[str], Must("a list of names (strings)")] = Field(
        None, description="the suites also run at temperatures > 0 (default: all of the profile's)")
    seeds: Annotated[list[SEED], Must("a non-empty list of integers")] = Field(
        [0], min_length=1,
        description="integers in [0, 2**63), distinct; sampled checks need two seeds, one not 0 (a warning "
                    "otherwise)")
    max_new_tokens: Annotated[int, Must("a positive integer")] = Field(
        None, ge=1, description="a cap on every item's budget")
    top_k: Annotated[int, Must("an integer >= 1 (leave it out for no top-k cut)")] = Field(
        None, ge=1,
        description="the top-k cut at sampling temperatures (default: none; greedy ignores it). Every decoder's "
                    "request carries it: in-process samplers apply it before top_p, engine decoders send it")
    exactness_prompts: int = Field(2, ge=0,
    description="rejection sampling: goodness-of-fit windows (3 tokens each); their tokens also join the PIT test")
    exactness_samples: int = Field(200, ge=1, description="rejection sampling: samples per window")
    exactness_reference: Annotated[str, Must('"target" or "engine:NAME"')] = Field(
        "target", pattern=r"^(target|engine:.+)$",
        description="what an exact engine candidate's sampled tokens are tested against: \"target\" (the harness's own"
                    " copy of the weights, teacher-forced) or \"engine:NAME\" (that engine's own top-k logprobs over "
                    "each output; engines-and-load.md)")
    looks: int = Field(1, ge=1, description="quality looks per suite (group-sequential; 1: the fixed design)")
    speed_items: int = Field(30, ge=0,
    description="baseline items timed afresh beside the candidates when the rest comes from the store: a sample "
                "stratified over suites, and within a suite by the stored baseline lengths where the store holds "
                "every work of it (else by category), "
                "seeded by the run; also the store's re-check (baseline-store-and-looks.md)")
    concurrency: Annotated[list[Annotated[int, Field(ge=1)]] | Annotated[int, Field(ge=1)],
                           Must("a list of distinct integers >= 1, e.g. [1, 4, 16]")] = Field(
        [],
        description="engine requests in flight, e.g. [1, 4, 16]: one paired comparison per level, each with its A/A "
                    "floor")
    rates: Annotated[list[Annotated[float, Field(gt=0)]],
                     Must("a list of distinct request rates > 0 (per second), e.g. [0.5, 1, 2]")] = Field(
        None, min_length=1,
        description="open-loop load: requests per second, e.g. [1, 2, 4], run after the quality run by the engine "
                    "baseline and each engine candidate on one seeded schedule (engines-and-load.md)")
    burstiness: Annotated[float, Must("a positive gamma shape (1: Poisson)")] = Field(
        1.0, gt=0,
        description="gamma shape of the gaps between arrivals (1: Poisson; below 1 burstier, above 1 more regular), "
                    "as vllm bench serve --burstiness")
    max_in_flight: int = Field(None, ge=1,
    description="a cap on requests in flight under load (default: none; a request waiting for a slot is not timed)")
    load_requests: int = Field(60, ge=1,
    description="requests per level (an SLO's 95% upper bound on a p95 needs at least 59)")
    load_seed: int = Field(0, ge=0, description="the load schedule's seed: gaps and item order")
    refine_levels: int = Field(2, ge=0, description="extra levels spent bracketing each crossover")
    client_workers: int = Field(None, ge=1,
    description="load client processes (default: as many as the measured client cost needs for the rate, "
                "at most the cores)")
    slo: Annotated[Slo, Must("a table of ttft_p95_s, tpot_p95_s, e2e_p95_s")] = Field(
        Slo(), description="[profiles.NAME.slo]: p95 objectives in seconds, gated where the baseline meets them")


class Gates(Table):
    alpha: Annotated[float, Must("a level in (0, 0.5)")] = Field(
        0.05, gt=0, lt=0.5,
        description="level of each one-sided test: non-inferiority per suite (a candidate must pass every suite, so "
                    "no multiplicity correction), the loss test at alpha / suites, the speed bound")
    near_tie_epsilon: Annotated[Annotated[float, Field(ge=0)] | Literal["auto"],
                                Must('"auto" or a number >= 0')] = Field(
        "auto",
        description="a baseline top-2 margin below this is a numerical tie: \"auto\" = 1e-3 in fp32, 1.0 in bf16, "
                    "raised to 2x the measured margin noise; or a number")
    exactness_pvalue: Annotated[float, Must("a level in (0, 0.5)")] = Field(
        0.01, gt=0, lt=0.5,
        description="family level of a rejection-sampling candidate's exactness checks (Bonferroni)")
    inconclusive: Literal["fail", "warn"] = Field(
        "fail", description='a comparison that shows neither pass nor failure: "fail" or "warn"')
    spending: Literal[SPENDING] = Field(SPENDING[0], description="alpha spending across a profile's looks")
    discordance: Annotated[float, Must("a share of pairs in (0, 1]")] = Field(
        0.2, gt=0, le=1, description="planning value of the discordant share, where no run observed it")
    aa_floor_max: Annotated[float, Must("a share of prompts in [0, 1]")] = Field(
        0.25, ge=0, le=1,
        description="an engine's A/A run that diverges on more than this share of prompts is no floor (another model"
                    " behind the alias, a broken server): an exact candidate that needs the floor is inconclusive")
    aa_noise_max: Annotated[float, Must("a positive number of logits")] = Field(
        1.0, gt=0,
        description="the same for the A/A run's noise: its top-2 margins moving by more than this many logits (an"
                    " upper 95% bound on their 99th percentile; the largest move where there are under 299) is not"
                    " batch noise")


class Engine(Table):
    base_url: Annotated[str, Must("a string", True)] = Field(
        None,
        description="\"http://host:port\" of an engine already running: health and served model name are checked "
                    "before any generation")
    launch: Annotated[str | list[str], Must("a command: a string or a list of strings")] = Field(
        None,
        description="the command decodegate starts, a string or a list; {port} (a free port, required), {llama-"
                    "server} and {gguf:NAME} are filled in")
    model: Annotated[str, Must("a string", True)] = Field(None, description="the model name the engine must serve")
    health_timeout_s: Annotated[float, Must("a positive number of seconds")] = Field(
        300.0, gt=0, description="how long to wait for a launched engine to become healthy")
    request_timeout_s: Annotated[float, Must("a positive number of seconds")] = Field(
        300.0, gt=0, description="one whole request, streaming included (not each read)")
    retries: int = Field(2, ge=0,
    description="bounded retries per request (connection errors, timeouts) before the run ends with exit 2")
    concurrency: int = Field(1, ge=1, description="requests in flight at once")
    api_key_env: Annotated[str, Must("a string", True)] = Field(
        None,
        description="the environment variable holding the API key (it must be set; secrets never sit in the config)")
    env: Annotated[dict[str, str | int | float], Must('a table of NAME = "value" strings')] = Field(
        {},
        description="extra environment variables for a launched engine (part of the baseline store key, as are "
                    "inherited LLAMA_ARG_*, VLLM_*, SGLANG_*, GGML_* and *_VISIBLE_DEVICES)")
    reuse_baseline: bool = Field(False,
    description="base_url engines only: true lets its baseline rows be reused from the store. Default false: a URL "
                "does not identify the deployment behind it, so its rows are generated in every run. Set it only "
                "where that deployment is pinned")


class Regress(Table):
    """A regress config file (decodegate regress --config FILE)."""
    target: Annotated[str, Must("a model name (an alias, a folder, a .gguf file or a Hugging Face id)")] = Field(
        min_length=1, pattern=r"\S",
        description="required: the target model (an alias, a local folder, a .gguf file or a Hugging Face id; see "
                    "Models below)")
    device: Annotated[str, Must('"cpu", "cuda", "cuda:N" or "mps"')] = Field(
        None, pattern=r"^(cpu|mps|cuda(:\d+)?)$",
        description="\"cpu\", \"cuda\", \"cuda:N\" or \"mps\"; default: CUDA when present, else CPU (anything else is "
                    "refused on load)")
    chat: Annotated[bool, Must("true or false (default: the model's chat template when it has one)", True)] = Field(
        None, description="apply the model's chat template (default: when it has one)")
    top_p: Annotated[float, Must("in (0, 1]")] = Field(1.0, gt=0, le=1,
    description="applied at sampling temperatures, in (0, 1] (greedy ignores it)")
    log_text: Annotated[bool, Must("true or false", True)] = Field(
        True,
        description="false: generated text stays in the run folder, never goes to MLflow: MLflow's tables, traces "
                    "and descriptions then carry the numbers only (ci-and-review.md)")
    trace_limit: Annotated[int, Must("an integer >= 0 (traces per decoder; 0: none)")] = Field(
        100, ge=0, description="MLflow traces per decoder and run, divergent prompts first (0: none)")
    labels: Annotated[dict[str, Any], Must("a table ([labels] or labels = { ... })")] = Field(
        {}, description="copied to MLflow tags: team, cost centre, dashboards and cost reports")
    baseline: Decoder = Field(None,
    description="[baseline]: the baseline decoder (default: \"standard\", named \"baseline\")")
    candidates: Annotated[list[Decoder], Must("a list of [[candidates]] tables", True)] = Field(
        [], description="[[candidates]]: one table per candidate")
    suites: Annotated[dict[str, Suite], Must("a table ([suites] or suites = { ... })")] = Field(
        {}, description="[suites.NAME]: the suites and their margins")
    profiles: Annotated[dict[str, Profile], Must("a table ([profiles] or profiles = { ... })")] = Field(
        {}, description="[profiles.NAME]: what a run covers")
    gates: Annotated[Gates, Must("a table ([gates] or gates = { ... })")] = Field(
        Gates(), description="[gates]: the levels and rules of the gate")
    engines: Annotated[dict[str, Engine], Must("a table ([engines] or engines = { ... })")] = Field(
        {}, description="[engines.NAME]: serving engines under test")


def json_schema() -> dict:
    """The JSON Schema of a regress config (draft 2020-12), as editors and `jsonschema` read it.
    A default of None is "not set" (TOML has no null), so it is left out, as are properties'
    titles (the key itself)."""
    def tidy(node):
        if isinstance(node, dict):
            props = node.get("properties", {})
            for prop in props.values():
                prop.pop("title", None)
                if "default" in prop and prop["default"] is None:
                    del prop["default"]
            for value in node.values():
                tidy(value)
        elif isinstance(node, list):
            for value in node:
                tidy(value)
        return node
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            **tidy(Regress.model_json_schema())}

# Where a table sits: its key at the top, and whether entries are named (suites.NAME) or listed.
_TABLES = {"baseline": (Decoder, 0), "gates": (Gates, 0), "candidates": (Decoder, 1), "suites": (Suite, 1),
           "profiles": (Profile, 1), "engines": (Engine, 1)}


def _locate(loc: tuple) -> tuple[type[Table], str, list]:
    """The table an error's location falls in, the table's label ("[suites.s]") and the rest."""
    model, where, rest = Regress, "", list(loc)
    if rest and rest[0] in _TABLES:
        cls, named = _TABLES[rest[0]]
        if len(rest) > 1:  # inside the table (or the named entry itself, for a table of tables)
            label = (f"[[candidates]] #{rest[1] + 1}" if rest[0] == "candidates" else
                     f"[{rest[0]}.{rest[1]}]" if named else f"[{rest[0]}]")
            model, where, rest = cls, f" {label}", rest[1 + named:]
    if model is Profile and len(rest) > 1 and rest[0] == "slo":
        model, where, rest = Slo, f"{where} slo", rest[1:]
    return model, where, rest


def _what(info) -> tuple[str, bool]:
    """What a key's value must be, in words, and whether the key is quoted in the message."""
    must = next((m for m in info.metadata if isinstance(m, Must)), None)
    if must:
        return must.text, must.quote
    kind = info.annotation
    if kind is bool:
        return "true or false", False
    if getattr(kind, "__origin__", None) is Literal:
        return "one of " + ", ".join(repr(a) for a in kind.__args__), False
    low = next((f">= {m.ge}" for m in info.metadata if getattr(m, "ge", None) is not None), "")
    return f"an integer {low}".rstrip() if kind is int else f"a {kind.__name__}", False


def _at(value, loc):
    for step in loc:
        if not (isinstance(value, dict) and step in value or isinstance(value, list) and isinstance(step, int)):
            break
        value = value[step]
    return value


def explain(error: ValidationError, raw: dict, path: str) -> str:
    """One line for the first problem pydantic found: an unknown key first (with the closest
    allowed name), then a missing one, then a value (with what it must be and what it was)."""
    errors = sorted(error.errors(), key=lambda e: (e["type"] != "extra_forbidden", e["type"] != "missing"))
    e = errors[0]
    model, where, rest = _locate(e["loc"])
    value = _at(raw, e["loc"][:len(e["loc"]) - len(rest) + 1])  # the whole list, not the item pydantic names
    where = f"{path}{where}"
    if not rest:  # a table's entry that is not a table
        return f"{where}: must be a table ({', '.join(list(model.model_fields)[:2])}, ...), got {value!r}"
    key = rest[0]
    if e["type"] == "extra_forbidden":
        allowed = sorted(model.model_fields)
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(allowed)}"
    if e["type"] == "missing":
        return f"{where}: missing key {key!r}"
    what, quote = _what(model.model_fields[key])
    return f"{where}: {repr(key) if quote else key} must be {what}, got {value!r}"
