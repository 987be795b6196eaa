"""Per-prompt review rows: each candidate's generation beside the baseline's, for MLflow's views.

Pure (no mlflow): records and summary.json in, plain rows out. One row per candidate, suite,
item, temperature and seed: suite, item, category; both texts (never with `log_text = false`);
identical or not and the first divergence (token position, the baseline's top-2 margin there,
and its class as the summary judged it: near-tie, within-floor or real); both grades and
latencies; α/τ (speculative) or mean exit layers (early exit). harness.run.tracking_views logs
them as a table, as traces and as assessments; per-category figures feed `decodegate history`.
"""
from __future__ import annotations

import json
from pathlib import Path

from harness.markup import md_cell
from harness.run.records import record_key

# Fields that carry generated or prompt text: dropped when log_text = false.
TEXT_FIELDS = ("prompt", "baseline_text", "candidate_text", "divergence_context", "baseline_grade_detail",
               "candidate_grade_detail")
ALL = "ALL"  # the pseudo-category of every row
CONTEXT_CHARS = 24  # characters of shared text shown before the first differing character


def prompts(run_dir: Path, summary: dict) -> dict:
    """(suite, item_id) -> the prompt as sent (text, or chat turns as JSON), from the suites the run
    used; a suite whose content hash no longer matches the run's is left out (the prompt would lie)."""
    run_dir = Path(run_dir)
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    import warnings
    from harness.config import ConfigError, load_config
    from suites import load_suite
    config = None
    for path in (meta.get("config"), run_dir / "config.toml"):
        try:
            with warnings.catch_warnings():  # the run already warned about its config
                warnings.simplefilter("ignore")
                config = load_config(path, meta.get("profile", summary.get("profile", "smoke")))
            break
        except (ConfigError, OSError, TypeError, ValueError):
            continue
    if config is None:
        return {}
    out = {}
    for name, info in (summary.get("suites") or {}).items():
        spec = config.suites.get(name)
        if spec is None or name.startswith("lmeval:"):
            continue
        try:
            suite = load_suite(spec.path or name)
        except (OSError, ValueError):
            continue
        if suite.hash != info.get("hash"):
            continue
        for item in suite.items:
            out[(name, item.id)] = item.prompt if item.messages is None else json.dumps(item.messages)
    return out


def baseline_name(summary: dict, cand: dict, names: set) -> str:
    """The baseline a candidate was paired with: per concurrency level under a sweep."""
    level = cand.get("concurrency")
    swept = f"{summary['baseline']}@c{level}"
    return swept if level is not None and swept in names else summary["baseline"]


def _divergences(cand: dict) -> dict:
    """(suite, item_id, seed, temperature) -> the summary's divergence (kind, position, margin)."""
    out = {}
    for suite, s in (cand.get("suites") or {}).items():
        for block in (s.get("identity") or {}).values():
            for d in block.get("divergences", []):
                out[(suite, d["item_id"], d["seed"], d["temperature"])] = d
    return out


def _prefix(a, b) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _context(base: str, cand: str) -> str:
    """Where the texts part: the shared text just before, then each side's continuation."""
    i = _prefix(base, cand)
    lead = base[max(0, i - CONTEXT_CHARS):i]
    return (f"…{lead}⟦ baseline: {base[i:i + CONTEXT_CHARS]!r} | candidate: {cand[i:i + CONTEXT_CHARS]!r} ⟧"
            if i < max(len(base), len(cand)) else "")


def _acceptance(rec: dict) -> dict:
    from analysis.acceptance import drafts_tested
    st = rec["stats"]
    try:
        tested = drafts_tested(rec)
    except ValueError:  # impossible counters: the summary's acceptance step fails on them, no number here
        return {}
    out = {"acceptance_rate": st["accepted"] / st["proposed"], "drafts_accepted": st["accepted"],
           "drafts_proposed": st["proposed"]}
    if tested:
        out.update(alpha=st["accepted"] / tested, drafts_tested=tested)
    return out


def _speed_stats(rec: dict) -> dict:
    """The record's acceptance numbers. `alpha` is the summary's quantity (accepted over the drafts
    the verifier tested: analysis.acceptance), not accepted / proposed (`acceptance_rate`, about
    half of it at K = 4); the counts are kept so that a category pools them as the summary does."""
    st = rec.get("stats") or {}
    out = _acceptance(rec) if st.get("proposed") else {}
    if st.get("target_forwards") and rec.get("tokens"):
        out["tau"] = len(rec["tokens"]) / st["target_forwards"]
        out["target_forwards"] = st["target_forwards"]
    if st.get("exit_layers"):
        out["mean_exit_layers"] = sum(st["exit_layers"]) / len(st["exit_layers"])
    return out


def pair_rows(records: list[dict], summary: dict, candidate: str, prompt_text: dict | None = None,
              log_text: bool = True) -> list[dict]:
    """The candidate's rows, in record order, each beside the baseline's generation of the same key."""
    cand = summary["candidates"][candidate]
    names = {r["candidate"] for r in records}
    base_name = baseline_name(summary, cand, names)
    base = {record_key(r)[1:]: r for r in records if r["candidate"] == base_name}
    divs = _divergences(cand)
    rows = []
    for r in records:
        if r["candidate"] != candidate:
            continue
        key = record_key(r)[1:]
        b = base.get(key)
        if b is None:
            continue
        bt, ct = b.get("tokens") or [], r.get("tokens") or []
        row = {"candidate": candidate, "baseline": base_name, "suite": r["suite"], "item_id": r["item_id"],
               "category": ",".join(r.get("categories") or []), "temperature": r["temperature"], "seed": r["seed"]}
        if b.get("error") or r.get("error"):
            row.update(identical=None, divergence="error", error=r.get("error") or f"baseline: {b['error']}")
        elif bt == ct:
            row.update(identical=True, divergence="identical")
        else:
            d = divs.get(key)
            pos = d["position"] if d else _prefix(bt, ct)
            margins = b.get("margins") or []
            margin = d["margin"] if d else (margins[pos] if pos < len(margins) else None)
            # Without the summary's judgment (e.g. sampled rejection, exact in distribution only),
            # the pair just differs: no class is claimed that the gate did not decide.
            row.update(identical=False, divergence=d["kind"] if d else "differs", divergence_position=pos,
                       divergence_margin=margin)
        row.update(baseline_score=b.get("score"), candidate_score=r.get("score"),
                   baseline_passed=b.get("passed"), candidate_passed=r.get("passed"),
                   baseline_tokens=len(bt), candidate_tokens=len(ct),
                   baseline_wall_s=(b.get("timing") or {}).get("wall_s"),
                   candidate_wall_s=(r.get("timing") or {}).get("wall_s"),
                   baseline_ttft_s=(b.get("timing") or {}).get("ttft_s"),
                   candidate_ttft_s=(r.get("timing") or {}).get("ttft_s"),
                   baseline_reused=bool(b.get("reused")), **_speed_stats(r))
        if log_text:
            row.update(prompt=(prompt_text or {}).get((r["suite"], r["item_id"])), baseline_text=b.get("text", ""),
                       candidate_text=r.get("text", ""),
                       divergence_context=_context(b.get("text", ""), r.get("text", "")) if row["identical"] is False
                       else "", baseline_grade_detail=b.get("grade_detail"),
                       candidate_grade_detail=r.get("grade_detail"))
        rows.append(row)
    return rows


def baseline_rows(records: list[dict], name: str, prompt_text: dict | None = None, log_text: bool = True) -> list[dict]:
    """The baseline's own generations, keyed like pair_rows (the parent run's table and traces)."""
    rows = []
    for r in records:
        if r["candidate"] != name:
            continue
        row = {"candidate": name, "suite": r["suite"], "item_id": r["item_id"],
               "category": ",".join(r.get("categories") or []), "temperature": r["temperature"], "seed": r["seed"],
               "score": r.get("score"), "passed": r.get("passed"), "tokens": len(r.get("tokens") or []),
               "wall_s": (r.get("timing") or {}).get("wall_s"), "ttft_s": (r.get("timing") or {}).get("ttft_s"),
               "reused": bool(r.get("reused"))}
        if r.get("error"):
            row["error"] = r["error"]
        if log_text:
            row.update(prompt=(prompt_text or {}).get((r["suite"], r["item_id"])), text=r.get("text", ""))
        rows.append(row)
    return rows


# Divergences first (the rows a reviewer opens), worst class first; then the rest in run order.
_ORDER = {"real": 0, "differs": 1, "unknown": 2, "within-floor": 3, "near-tie": 4, "error": 5, "identical": 6}


def for_traces(rows: list[dict], limit: int) -> list[dict]:
    """At most `limit` rows to trace, divergent ones first."""
    ranked = sorted(enumerate(rows), key=lambda ir: (_ORDER.get(ir[1].get("divergence"), 6), ir[0]))
    return [r for _, r in ranked[:max(0, limit)]]


def row_key(row: dict) -> tuple:
    return (row["suite"], row["item_id"], row["seed"], row["temperature"])


def category_metrics(rows: list[dict]) -> dict:
    """Per category (and ALL): identity rate at T=0, speedup (ratio of total wall time over pairs whose baseline was
    timed in this run) and mean α / τ / exit layers; the trend `decodegate history` draws."""
    by_cat: dict = {ALL: list(rows)} if rows else {}
    for r in rows:
        for cat in (r["category"] or "uncategorized").split(","):
            by_cat.setdefault(cat, []).append(r)
    out = {}
    for cat, rs in by_cat.items():
        m = {"n": len(rs)}
        # Greedy pairs only, as the report's identity: a sampled pair of an exact-in-distribution
        # decoder (rejection verification) may differ by design, and counted here it read as a loss.
        judged = [r for r in rs if r["identical"] is not None and r["temperature"] == 0]
        if judged:
            m["identity"] = sum(bool(r["identical"]) for r in judged) / len(judged)
        timed = [r for r in rs if not r["baseline_reused"] and r.get("baseline_wall_s") and r.get("candidate_wall_s")]
        if timed:
            m["speedup"] = sum(r["baseline_wall_s"] for r in timed) / sum(r["candidate_wall_s"] for r in timed)
        # Ratios of sums, as the summary's alpha and tau are: the report and `history` agree.
        drafted = [r for r in rs if r.get("drafts_proposed")]
        tested = [r for r in drafted if r.get("drafts_tested")]
        if tested:
            m["alpha"] = sum(r["drafts_accepted"] for r in tested) / sum(r["drafts_tested"] for r in tested)
        elif drafted:  # no record with per-round or per-position counts: the summary's fallback too
            m["alpha"] = sum(r["drafts_accepted"] for r in drafted) / sum(r["drafts_proposed"] for r in drafted)
        forwards = [r for r in rs if r.get("target_forwards") and r.get("candidate_tokens")]
        if forwards:
            m["tau"] = sum(r["candidate_tokens"] for r in forwards) / sum(r["target_forwards"] for r in forwards)
        exits = [r["mean_exit_layers"] for r in rs if r.get("mean_exit_layers") is not None]
        if exits:
            m["mean_exit_layers"] = sum(exits) / len(exits)
        out[cat] = m
    return out


def _cell(x) -> str:
    """A Markdown table cell: one line (line breaks shown as ⏎), no markup (harness.markup)."""
    s = "–" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))
    return md_cell(s.replace("\r\n", "\n").replace("\n", "⏎ ")).replace("`", "'")


def divergence_markdown(rows: list[dict], limit: int = 20) -> str:
    """The candidate's divergent prompts as a Markdown table (the run page renders it), with both
    texts where they may be shown."""
    div = [r for r in for_traces(rows, len(rows)) if r["identical"] is False][:limit]
    if not div:
        return "No prompt diverged from the baseline."
    text = "candidate_text" in div[0]
    head = ["suite", "item", "T", "seed", "class", "token", "margin"] + (["where they part", "baseline", "candidate"]
                                                                        if text else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in div:
        cells = [r["suite"], r["item_id"], r["temperature"], r["seed"], r["divergence"], r.get("divergence_position"),
                 r.get("divergence_margin")]
        if text:
            cells += [r.get("divergence_context"), (r.get("baseline_text") or "")[:300],
                      (r.get("candidate_text") or "")[:300]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    more = sum(r["identical"] is False for r in rows) - len(div)
    return "\n".join(lines) + (f"\n\n…and {more} more in `prompts.json` (Artifacts)." if more > 0 else "")
