"""The verdict's acceptance as production monitoring reads it: what `watch` and
`export-monitoring` compare live counters with.

An engine's counters give accepted / drafted tokens (the *acceptance rate*; Leviathan's α needs
per-round counts the counters do not keep). So the reference is the same ratio over the reference
run's records of one candidate: its value, a bootstrap interval resampling prompts (the rounds of
one prompt share its predictability), and the overdispersion φ of per-request counts (with its
upper bound, which the detector's statistic and the rules are scaled by). A run folder (summary.json + records.jsonl) or `mlflow:RUN_ID`
(the same two artifacts of a run that `regress` or `sync` logged).

The reference is taken at one temperature: acceptance at T = 0 and at T > 0 differ a lot, and
production traffic has its own mix, so a run that drafted at several temperatures needs
`temperature` (the CLI's --temperature) naming the one the watched traffic runs at.

Refused (LiveReferenceError, exit 2): no such folder or run, no candidate with drafted tokens, or
several and none chosen; several temperatures and none chosen; fewer drafting requests than a
finite upper bound on φ needs (2; a request that drafted 0 tokens does not count).
"""
from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis._common import cluster_index, cluster_sums
from analysis.acceptance import ratio_ci
from analysis.drift_detector import dispersion, dispersion_upper
from harness.run.records import read_records
from harness.verdict.acceptance_ref import DEFAULT_TOLERANCE

LEVEL = 0.95
MIN_DRAFTING_REQUESTS = 2   # a finite upper bound on φ: χ² with R − 1 ≥ 1 degrees of freedom
# The engines whose metric names were checked against a real scrape (tests/data, the engine tests),
# keyed by the engine's name as a run records it, case-folded ("vLLM", "llama.cpp"). Anything else
# is refused by `metric_prefix`: a default would export one engine's rules under another's names.
ENGINE_PREFIX = {"llama.cpp": "llamacpp", "vllm": "vllm"}


class LiveReferenceError(ValueError):
    """A reference that cannot be monitored against."""


@dataclass(frozen=True)
class LiveReference:
    source: str
    candidate: str
    engine: str | None            # "llama.cpp", "vllm", ... where the run's candidate was an engine
    labels: dict                  # the config's labels and the candidate's, names made Prometheus-safe
    ratio: float                  # accepted / drafted over the run
    low: float                    # its interval at `level`
    high: float
    level: float
    dispersion: float             # φ of per-request counts
    dispersion_upper: float       # its one-sided 95% upper bound: what the detector and rules use
    drafted: int
    accepted: int
    requests: int
    temperature: float | None = None   # the reference's temperature (one per reference)

    @property
    def metric_prefix(self) -> str:
        """The engine's metric prefix; an engine without verified names is refused, never defaulted."""
        prefix = ENGINE_PREFIX.get((self.engine or "").casefold())
        if prefix is None:
            ran = f"on engine {self.engine!r}" if self.engine else "not on a serving engine (no engine recorded)"
            raise LiveReferenceError(
                f"reference {self.source}: candidate {self.candidate!r} ran {ran}; rules and dashboards exist for "
                f"{' and '.join(sorted(set(ENGINE_PREFIX)))} only (metric names checked against their real scrapes)")
        return prefix

    def boundary(self, tolerance: float = DEFAULT_TOLERANCE) -> float:
        """p0: the lowest acceptance still in control (the lower bound, less the tolerance)."""
        return self.low * (1 - tolerance)

    def monitored_boundary(self, tolerance: float = DEFAULT_TOLERANCE) -> float:
        """p0, refused where it is not inside (0, 1): a boundary of 0 makes a detector and an alert
        that can never fire (acceptance cannot fall below 0)."""
        p0 = self.boundary(tolerance)
        if not 0 < p0 < 1:
            raise LiveReferenceError(
                f"reference {self.source}: candidate {self.candidate!r} accepted {self.accepted} of {self.drafted} "
                f"drafted tokens (lower bound {self.low:.3f}, boundary {p0:.3f}): there is no acceptance to fall from")
        return p0


def bound_factor(requests: int, level: float = 0.95) -> float:
    """How far the upper bound on φ lies above its estimate with `requests` drafting requests."""
    from scipy import stats
    return (requests - 1) / float(stats.chi2.ppf(1 - level, requests - 1))


def prometheus_label(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return name if re.match(r"[A-Za-z_]", name) else f"_{name}"


def load(source: str, candidate: str | None = None, *, tracking_uri: str | None = None,
         temperature: float | None = None, rng: int = 0) -> LiveReference:
    """The reference of `candidate` at `temperature` (needed when the run drafted at several)."""
    if source.startswith("mlflow:"):
        with tempfile.TemporaryDirectory() as tmp:
            _download(source[len("mlflow:"):], Path(tmp), tracking_uri)
            return _from_folder(Path(tmp), candidate, source, temperature, rng)
    folder = Path(source)
    if not folder.is_dir():
        raise LiveReferenceError(f"reference {source!r} is neither a run folder nor mlflow:RUN_ID")
    return _from_folder(folder, candidate, source, temperature, rng)


def _download(run_id: str, into: Path, uri: str | None) -> None:
    from harness.run import tracking
    uri = tracking.resolve_uri(uri)
    tracking.check_health(uri)
    client = tracking._client(uri)
    for name in ("summary.json", "records.jsonl"):
        try:
            client.download_artifacts(run_id, name, str(into))
        except Exception as e:  # noqa: BLE001 - MLflow raises several types for a missing run or file
            raise LiveReferenceError(f"reference mlflow:{run_id} at {uri}: cannot fetch {name} ({type(e).__name__}: "
                                 f"{str(e)[:200]})") from e


def _from_folder(folder: Path, candidate: str | None, source: str, temperature: float | None,
                 rng: int) -> LiveReference:
    summary_path = folder / "summary.json"
    if not summary_path.is_file() or not (folder / "records.jsonl").is_file():
        raise LiveReferenceError(f"reference {source}: not a finished run (needs summary.json and records.jsonl)")
    summary = json.loads(summary_path.read_text())
    records = read_records(folder)
    drafting = {r.get("candidate") for r in records if (r.get("stats") or {}).get("proposed")}
    cands = summary.get("candidates", {})
    if candidate is None:
        choices = sorted(n for n in cands if n in drafting)
        if len(choices) != 1:
            raise LiveReferenceError(f"reference {source}: " + (
                f"several candidates drafted ({', '.join(choices)}): choose one with --candidate" if choices
                else "no candidate has acceptance (no drafted tokens in its records): was it speculative?"))
        candidate = choices[0]
    if candidate not in cands:
        raise LiveReferenceError(f"reference {source} has no candidate {candidate!r} (it has: {', '.join(cands) or 'none'})")
    if candidate not in drafting:
        raise LiveReferenceError(f"reference {source}: candidate {candidate!r} has no acceptance "
                             f"(no drafted tokens in its records): was it speculative?")
    rows = [r for r in records if r.get("candidate") == candidate and not r.get("error")
            and (r.get("stats") or {}).get("proposed") is not None]
    rows, temperature = _at_temperature(rows, temperature, candidate, source)
    return _measure(summary, cands[candidate], candidate, rows, source, temperature, rng)


def _at_temperature(rows: list[dict], temperature: float | None, candidate: str, source: str):
    """The rows of one temperature: acceptance at T = 0 and T > 0 differ, and production has its own mix."""
    temps = sorted({float(r.get("temperature", 0.0)) for r in rows})
    if temperature is None:
        if len(temps) > 1:
            each = ", ".join(f"T={t:g}: {_ratio([r for r in rows if float(r.get('temperature', 0.0)) == t]):.3f}"
                             for t in temps)
            raise LiveReferenceError(f"reference {source}: candidate {candidate!r} drafted at several temperatures "
                                     f"({each}): choose the one the watched traffic runs at with --temperature")
        return rows, (temps[0] if temps else None)
    if float(temperature) not in temps:
        raise LiveReferenceError(f"reference {source}: candidate {candidate!r} has no drafting request at "
                                 f"--temperature {temperature:g} (it has: {', '.join(f'{t:g}' for t in temps) or 'none'})")
    return [r for r in rows if float(r.get("temperature", 0.0)) == float(temperature)], float(temperature)


def _ratio(rows: list[dict]) -> float:
    drafted = sum(float(r["stats"]["proposed"]) for r in rows)
    return sum(float(r["stats"].get("accepted", 0)) for r in rows) / drafted if drafted else float("nan")


def _measure(summary: dict, cand: dict, candidate: str, rows: list[dict], source: str,
             temperature: float | None, rng: int) -> LiveReference:
    drafting = [r for r in rows if float(r["stats"]["proposed"]) > 0]
    if len(drafting) < MIN_DRAFTING_REQUESTS:
        raise LiveReferenceError(
            f"reference {source}: candidate {candidate!r} drafted in {len(drafting)} request(s)"
            f"{'' if temperature is None else f' at T={temperature:g}'}; a finite upper bound on its dispersion φ "
            f"needs at least {MIN_DRAFTING_REQUESTS} drafting requests (and the bound is wide with few: "
            f"{bound_factor(2):.0f}x the estimate with 2, {bound_factor(12):.1f}x with 12, {bound_factor(50):.2f}x "
            f"with 50): rerun `regress` with more prompts")
    a = np.array([float(r["stats"].get("accepted", 0)) for r in rows])
    n = np.array([float(r["stats"]["proposed"]) for r in rows])
    ids = cluster_index([(r.get("suite"), r.get("item_id")) for r in rows])
    low, high = ratio_ci(*cluster_sums(ids, a, n), LEVEL, 4000, np.random.default_rng(rng))
    labels = {prometheus_label(k): str(v) for k, v in {**summary.get("labels", {}), **cand.get("labels", {})}.items()}
    engine = (cand.get("engine") or {}).get("engine") or (cand.get("decoder") if str(cand.get("decoder")).casefold()
                                                          in ENGINE_PREFIX else None)
    return LiveReference(source=source, candidate=candidate, engine=engine, labels=labels, temperature=temperature,
                         ratio=float(a.sum() / n.sum()), low=low, high=high, level=LEVEL,
                         dispersion=dispersion(a, n), dispersion_upper=dispersion_upper(a, n), drafted=int(n.sum()), accepted=int(a.sum()), requests=len(rows))
