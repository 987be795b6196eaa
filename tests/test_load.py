"""Open-loop load, the pure parts: the seeded schedule (the same for every decoder, gamma moments),
the metrics on constructed token times (TPOT, ITL, p99 only where n allows), goodput, SLO gating
(over capacity is not gated, missing evidence fails), the crossover and its bracketing, and the
config keys. The engine end of it is tests/test_load_engine.py."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from analysis.load import (crossover, good, judge_level, level_metrics, level_speedup, p95_bound, pays, refine_rate,
                           tpot)
from harness.config import ConfigError, Gates, load_config
from harness.run.load import item_order, schedule, unit_offsets
from harness.verdict.slo import gates as slo_gates, level_outcome

ROOT = Path(__file__).resolve().parent.parent


class _Suite:
    name = "s"


class _Item:
    def __init__(self, i):
        self.id = f"i{i}"


def works(n=7):
    from harness.run.runner import WorkItem
    return [WorkItem(_Suite(), _Item(i), 0.0, 0) for i in range(n)]


# ------------------------------------------------------------------------------------ schedule

def test_schedule_is_reproducible_and_the_same_items_sit_at_the_same_offsets():
    w = works()
    a = schedule(w, 2.0, requests=30, burstiness=1.0, seed=5)
    b = schedule(w, 2.0, requests=30, burstiness=1.0, seed=5)
    assert [(x.index, x.offset_s, x.work.item.id) for x in a] == [(x.index, x.offset_s, x.work.item.id) for x in b]
    c = schedule(w, 2.0, requests=30, burstiness=1.0, seed=6)
    assert [x.offset_s for x in a] != [x.offset_s for x in c]
    # Another rate: the same items in the same order, the offsets scaled by the rate (common random numbers).
    d = schedule(w, 4.0, requests=30, burstiness=1.0, seed=5)
    assert [x.work.item.id for x in d] == [x.work.item.id for x in a]
    assert np.allclose([2 * x.offset_s for x in d], [x.offset_s for x in a])
    assert a[0].offset_s == 0.0 and all(y.offset_s >= x.offset_s for x, y in zip(a, a[1:]))


def test_every_item_is_used_before_any_repeats():
    order = item_order(7, 21, seed=1)
    for k in range(3):
        assert sorted(order[7 * k:7 * (k + 1)]) == list(range(7))
    assert order[:7] != order[7:14]  # reshuffled each time round


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_gamma_gaps_have_the_mean_and_spread_vllm_bench_serve_gives(burstiness):
    gaps = np.diff(unit_offsets(40001, burstiness, seed=0)) / 3.0  # rate 3 req/s
    assert gaps.mean() == pytest.approx(1 / 3.0, rel=0.02)
    # Gamma with shape b: squared coefficient of variation 1/b (b = 1: exponential, Poisson arrivals).
    assert (gaps.std() / gaps.mean()) ** 2 == pytest.approx(1 / burstiness, rel=0.05)


# ------------------------------------------------------------------------------------- metrics

def row(i, ttft, gaps, *, item=None, error=None, stats=None):
    times = [ttft, *gaps]
    r = {"index": i, "suite": "s", "item_id": item or f"i{i % 12}", "ttft_s": ttft, "e2e_s": sum(times),
         "token_times_s": times, "n_tokens": len(times), "stats": stats or {}, "error": error}
    if error:
        r.update(n_tokens=0, token_times_s=[], e2e_s=None, ttft_s=None)
    return r


def test_tpot_itl_and_percentiles_on_constructed_token_times():
    # A speculative-looking stream: rounds of 3 tokens, the round's cost on its first gap.
    r = row(0, 0.5, [0.3, 0.0, 0.0, 0.3, 0.0, 0.0])
    assert tpot(r) == pytest.approx(0.6 / 6)
    assert tpot(row(1, 0.5, [])) is None  # one token: no decode phase
    rows = [row(i, 0.1 * (i + 1), [0.05] * 4) for i in range(20)]
    m = level_metrics(rows, duration_s=10.0)
    assert m["n"] == 20 and m["errors"] == 0
    assert m["ttft"]["p50"] == pytest.approx(1.05) and m["tpot"]["p50"] == pytest.approx(0.05)
    lo, hi = m["ttft"]["p50_ci"]
    assert lo < 1.05 < hi
    # p99 of 20 requests is not estimated: it is None, with the n it would need.
    assert m["e2e"]["p99"] is None and m["e2e"]["p99_needs_n"] == 100 and m["e2e"]["p90"] is not None
    assert m["itl"]["n"] == 80 and m["itl"]["p90"] == pytest.approx(0.05) and m["itl"]["p99"] is None
    assert m["output_throughput_tok_s"]["value"] == pytest.approx(100 / 10.0)


def test_p99_needs_a_hundred_observations():
    m = level_metrics([row(i, 0.1, [0.01 * (i % 5)] * 2) for i in range(120)], duration_s=30)
    assert m["e2e"]["p99"] is not None and m["e2e"]["n"] == 120
    assert level_metrics([row(i, 0.1, [0.01]) for i in range(99)], duration_s=30)["e2e"]["p99"] is None


def test_goodput_counts_requests_meeting_every_slo_and_failures_meet_none():
    slo = {"ttft_p95_s": 0.5, "e2e_p95_s": 1.0}
    rows = [row(0, 0.2, [0.1]), row(1, 0.6, [0.1]), row(2, 0.2, [0.9]), row(3, 0.1, [0.1], error="HTTP 503")]
    assert [good(r, slo) for r in rows] == [True, False, False, False]
    m = level_metrics(rows, duration_s=2.0, slo=slo)
    g = m["goodput_rps"]
    assert g["value"] == pytest.approx(0.5) and g["good"] == 1 and g["of"] == 4
    assert g["ci"][0] < 0.5 < g["ci"][1]
    assert m["errors"] == 1 and "HTTP 503" in m["first_error"]


def test_acceptance_weighted_per_token_and_per_request_are_different_numbers():
    # A long completion accepting everything and three short ones accepting nothing.
    rows = [row(0, 0.1, [0.01] * 5, stats={"telemetry": "per-request", "proposed": 90, "accepted": 90})]
    rows += [row(i, 0.1, [0.01] * 5, stats={"telemetry": "per-request", "proposed": 10, "accepted": 0}) for i in (1, 2, 3)]
    acc = level_metrics(rows, duration_s=1.0, prometheus={"draft_tokens": 120, "accepted": 60})["acceptance"]
    assert acc["per_token"]["value"] == pytest.approx(90 / 120) and "per token" in acc["per_token"]["weighting"]
    assert acc["per_request"]["value"] == pytest.approx(0.25) and "per request" in acc["per_request"]["weighting"]
    assert acc["level"]["value"] == 0.5 and "level" in acc["level"]["source"]


def test_p95_bound_exists_from_59_requests_and_failures_count_as_never_answered():
    assert p95_bound([0.1] * 58)["bound"] == "too few"
    b = p95_bound([0.01 * i for i in range(100)])
    assert b["bound"] == "exists" and b["upper_bound"] >= b["p95"]
    assert p95_bound([0.1] * 80 + [None])["bound"] == "on failed requests"


# ------------------------------------------------------------------------------------- SLO gates

def _level(ttft, n=80, errors=0):
    rows = [row(i, ttft, [0.01]) for i in range(n)] + [row(n + i, 0, [], error="HTTP 503") for i in range(errors)]
    return level_metrics(rows, duration_s=10, slo={"ttft_p95_s": 0.5})


def test_slo_is_gated_on_the_candidates_bound_only_where_the_baseline_meets_it():
    assert level_outcome("ttft_p95_s", _level(0.2), _level(0.3))[0] == "pass"
    outcome, words = level_outcome("ttft_p95_s", _level(0.2), _level(0.8))
    assert outcome == "fail" and "upper bound" in words
    # The baseline misses it: over capacity, whatever the candidate does.
    assert level_outcome("ttft_p95_s", _level(0.9), _level(0.8))[0] == "over capacity"
    assert level_outcome("ttft_p95_s", _level(0.2, errors=10), _level(0.2))[0] == "over capacity"


def test_slo_fails_closed_when_evidence_is_missing():
    # Too few requests for an upper bound: inconclusive, a failure under inconclusive = "fail".
    assert level_outcome("ttft_p95_s", _level(0.2), _level(0.2, n=20))[0] == "inconclusive"
    # The candidate's bound lands on a refused request; the candidate has no rows; no baseline rows.
    assert level_outcome("ttft_p95_s", _level(0.2), _level(0.2, errors=1))[0] == "fail"
    assert level_outcome("ttft_p95_s", _level(0.2), None)[0] == "fail"
    assert level_outcome("ttft_p95_s", None, _level(0.2))[0] == "inconclusive"
    levels = [{"rate": 1.0, "baseline": _level(0.2), "candidate": _level(0.2, n=20)},
              {"rate": 2.0, "baseline": _level(0.9), "candidate": _level(0.9)}]
    [g] = slo_gates(levels, {"ttft_p95_s": 0.5}, Gates(inconclusive="fail"))
    assert g.status == "fail" and "1 req/s: INCONCLUSIVE" in g.detail and "2 req/s: over capacity" in g.detail
    assert slo_gates(levels, {"ttft_p95_s": 0.5}, Gates(inconclusive="warn"))[0].status == "warn"
    everywhere_over = [{"rate": 1.0, "baseline": _level(0.9), "candidate": _level(0.1)}]
    [g] = slo_gates(everywhere_over, {"ttft_p95_s": 0.5}, Gates())
    assert g.status == "warn" and "not gated" in g.detail


# ------------------------------------------------------------------------------------- crossover

def test_speedup_pays_and_the_crossover_statuses():
    base = [row(i, 0.1, [0.1] * 9) for i in range(30)]   # 12 items: a speed bound needs 8 prompts
    fast = [row(i, 0.05, [0.05 + 0.001 * (i % 3)] * 9) for i in range(30)]
    slow = [row(i, 0.2, [0.2 + 0.001 * (i % 3)] * 9) for i in range(30)]
    sp = level_speedup(base, fast)
    assert sp["statistic"] > 1.5 and sp["lower_bound"] > 1 and sp["n_prompts"] == 12
    few = level_speedup(base[:7], fast[:7])  # 7 prompts: no bound, and so not shown to pay
    assert few["lower_bound"] is None and pays(level_metrics(fast[:7], duration_s=10), few) == (
        False, "no speedup bound (7 prompt(s), fewer than the 8 a bound needs)")
    assert judge_level(base, fast, duration_s=10)["pays"]
    j = judge_level(base, slow, duration_s=10)
    assert not j["pays"] and "lower bound" in j["why"]
    assert not pays(level_metrics(fast[:-1] + [row(29, 0, [], error="x")], duration_s=10), sp)[0]  # a failure
    assert crossover([(1, False), (2, False)])["status"] == "never pays"
    assert crossover([(1, True), (2, True)]) == {"status": "pays at every level tried", "rate": 2, "next": None}
    assert crossover([(4, False), (1, True), (2, True)]) == {"status": "pays up to", "rate": 2, "next": 4}
    # "stays": a level that pays above one that did not does not move the crossover up.
    assert crossover([(1, True), (2, False), (4, True)])["rate"] == 1


def test_bracketing_converges_on_the_crossover_within_its_budget():
    truth = 3.0  # pays below 3 req/s
    levels = [(r, r < truth) for r in (1.0, 2.0, 4.0, 8.0)]
    tried = []
    for _ in range(3):  # a budget of three extra levels
        nxt = refine_rate(levels)
        if nxt is None:
            break
        tried.append(nxt)
        levels.append((nxt, nxt < truth))
    assert tried[0] == pytest.approx(math.sqrt(8), rel=1e-2) and len(tried) == 3
    c = crossover(levels)
    assert c["rate"] < truth < c["next"] and c["next"] / c["rate"] < 1.2
    assert refine_rate([(1.0, True), (1.05, False)]) is None  # narrower than 10%: done
    assert refine_rate([(1.0, False), (2.0, False)]) is None and refine_rate([(1.0, True)]) is None


# ---------------------------------------------------------------------------------------- config

def _cfg(tmp_path, profile: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(f"""target = "smollm2-135m"
[engines.a]
base_url = "http://127.0.0.1:1"
[baseline]
decoder = "llama.cpp"
options = {{ engine = "a" }}
[[candidates]]
name = "c"
decoder = "llama.cpp"
options = {{ engine = "a" }}
[profiles.load]
subset = "smoke"
suites = ["factual"]
{profile}
""")
    return p


def test_load_profile_keys_parse_and_typos_are_refused(tmp_path):
    cfg = load_config(_cfg(tmp_path, "rates = [4, 1]\nburstiness = 0.5\nmax_in_flight = 3\nload_requests = 20\n"
                                     "[profiles.load.slo]\nttft_p95_s = 1.5\n"), "load")
    load = cfg.profile.load
    assert load.rates == (1.0, 4.0) and load.burstiness == 0.5 and load.max_in_flight == 3 and load.requests == 20
    assert load.slo.items() == {"ttft_p95_s": 1.5} and load.refine_levels == 2
    for bad, msg in [("rates = [0, 1]", "rates must be"), ("rates = [1]\nburstiness = -1", "burstiness"),
                     ("burstiness = 2", "need rates"), ("rates = [1]\n[profiles.load.slo]\nttft_p59_s = 1", "ttft_p95_s"),
                     ("rates = [1]\nmax_in_flight = 0", "max_in_flight")]:
        with pytest.raises(ConfigError, match=msg):
            load_config(_cfg(tmp_path, bad), "load")


def test_load_needs_engine_decoders(tmp_path):
    p = _cfg(tmp_path, "rates = [1]")
    p.write_text(p.read_text().replace('decoder = "llama.cpp"\noptions = { engine = "a" }\n[[candidates]]',
                                       'decoder = "standard"\n[[candidates]]'))
    with pytest.raises(ConfigError, match="need an engine baseline"):
        load_config(p, "load")


def test_shipped_load_profile():
    cfg = load_config(ROOT / "regress-engine.toml", "load")
    assert len(cfg.profile.load.rates) >= 3 and cfg.profile.load.slo.items()
    assert {c.name for c in cfg.candidates} == {"llama-ngram", "llama-draft"}


# ---------------------------------------------------------------------------- failed requests

def _run_dir(tmp_path, base_errors: int, cand_errors: int, n: int = 20, *, kept: int | None = None,
             cap_wait: float = 0.0) -> Path:
    """load.jsonl / load_levels.jsonl as harness.run.load writes them: one level at 1 req/s, `n`
    requests played a side; `kept` of the candidate's rows left in load.jsonl, each request held
    `cap_wait` s for a max_in_flight slot."""
    import json
    rows = []
    for name, errors in (("baseline", base_errors), ("c", cand_errors)):
        for i in range(n if name == "baseline" or kept is None else kept):
            r = row(i, 0.2, [0.05] * 9, error="HTTP 503: server is down" if i < errors else None)
            rows.append({**r, "candidate": name, "rate": 1.0, "cap_wait_s": cap_wait})
    (tmp_path / "load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    levels = [{"candidate": name, "rate": 1.0, "wall_s": 20.0, "requests": n} for name in ("baseline", "c")]
    (tmp_path / "load_levels.jsonl").write_text("".join(json.dumps(lv) + "\n" for lv in levels))
    return tmp_path


@pytest.mark.parametrize("base_errors,cand_errors,status,needle", [
    (0, 20, "fail", "the candidate failed 20 of 20"),        # the candidate's engine died under load
    (0, 1, "fail", "the baseline 0 of 20"),
    (20, 20, "fail", "inconclusive: the baseline failed"),  # both died: nothing was compared
    (1, 2, "warn", "both sides"),                            # over capacity on both, no test tells them apart
    (0, 0, "pass", "no failed candidate request"),
])
def test_failed_load_requests_are_gated_without_an_slo(tmp_path, base_errors, cand_errors, status, needle):
    """No [profiles.NAME.slo]: a candidate whose every load request failed passed (its gates were
    the unloaded run's)."""
    from harness.verdict.load import apply
    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 20"), "load")
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    passed = apply(summary, cfg, _run_dir(tmp_path, base_errors, cand_errors))
    [gate] = [g for g in summary["candidates"]["c"]["gates"] if g["name"] == "load errors"]
    assert gate["status"] == status and needle in gate["detail"]
    assert passed == (status != "fail") and (summary["candidates"]["c"]["verdict"] == "fail") == (status == "fail")


def test_load_rows_missing_from_the_file_fail_the_errors_gate(tmp_path):
    """The harness played 60 requests; load.jsonl holds 5 of the candidate's (lost, or edited). The
    errors gate counted the 5 and passed."""
    from harness.verdict.load import apply
    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 60"), "load")
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    assert not apply(summary, cfg, _run_dir(tmp_path, 0, 0, n=60, kept=5))
    [gate] = [g for g in summary["candidates"]["c"]["gates"] if g["name"] == "load errors"]
    assert gate["status"] == "fail" and "55 of the candidate's 60 requests have no row" in gate["detail"]


def test_a_level_max_in_flight_held_back_is_not_judged_at_its_nominal_rate(tmp_path):
    """Requests that waited 2 s for a slot at 1 req/s: the engine saw far less than 1 req/s, and
    latencies counted from sending met the SLO (the red-team case: 80 req/s offered, 19.5 sent)."""
    from harness.verdict.load import apply
    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 60\nmax_in_flight = 1\n"
                                     "[profiles.load.slo]\nttft_p95_s = 1.0"), "load")
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    assert not apply(summary, cfg, _run_dir(tmp_path, 0, 0, n=60, cap_wait=2.0))
    [gate] = [g for g in summary["candidates"]["c"]["gates"] if g["name"] == "slo ttft_p95_s"]
    assert gate["status"] == "fail" and "held the baseline's requests back (a median 2 s" in gate["detail"]
    level = next(e for e in summary["load"]["levels"] if e["decoder"] == "c")
    assert level["metrics"]["held_back"] == {"p50_s": 2.0, "p95_s": 2.0, "throttled": True}
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    assert apply(summary, cfg, _run_dir(tmp_path, 0, 0, n=60, cap_wait=0.01))   # a short wait: judged


def test_a_request_without_a_usable_time_is_a_failed_request():
    """A NaN end-to-end time (a broken clock, a row edited by hand) counted as a good request, and
    a NaN in the baseline made a level "over capacity" and left it ungated."""
    from analysis.load import good, ok
    fine = row(0, 0.2, [0.05] * 3)
    assert ok(fine) and good(fine, {"e2e_p95_s": 1.0})
    for bad in (float("nan"), float("inf"), -1.0):
        assert not ok({**fine, "e2e_s": bad}) and not good({**fine, "e2e_s": bad}, {"e2e_p95_s": 1.0})


def test_counters_that_went_back_in_a_level_measure_no_acceptance():
    """An engine restarted during a level: its counters' difference was -16 drafted, -7 accepted,
    and the report printed a level α of 0.44."""
    from analysis.load import level_metrics
    rows = [row(i, 0.2, [0.05] * 3) for i in range(5)]
    m = level_metrics(rows, duration_s=5.0, prometheus={"draft_tokens": -16.0, "accepted": -7.0})
    assert m["acceptance"]["level"]["value"] is None and "reset during the level" in m["acceptance"]["level"]["error"]
    m = level_metrics(rows, duration_s=5.0, prometheus={"draft_tokens": 16.0, "accepted": 7.0})
    assert m["acceptance"]["level"]["value"] == pytest.approx(7 / 16)


@pytest.mark.full
def test_a_level_max_in_flight_held_back_is_no_evidence_that_the_candidate_pays(tmp_path):
    """At 2 req/s the requests waited 1 s for a slot (the engine saw far less than 2 req/s), yet the
    report said the candidate "pays at every level tried (up to 2 req/s)" (red-team finding)."""
    import json

    from harness.verdict.load import apply, lines
    base = [row(i, 0.1, [0.1] * 9) for i in range(30)]
    fast = [row(i, 0.05, [0.05 + 0.001 * (i % 3)] * 9) for i in range(30)]
    held = lambda rows: [{**r, "cap_wait_s": 1.0} for r in rows]  # noqa: E731
    assert judge_level(base, fast, duration_s=10, rate=2.0)["pays"]
    j = judge_level(base, held(fast), duration_s=10, rate=2.0)
    assert j["pays"] is None and "held the candidate's requests back" in j["why"]
    assert judge_level(held(base), fast, duration_s=10, rate=2.0)["pays"] is None
    assert judge_level(base, held(fast), duration_s=10, rate=0.5)["pays"]   # 1 s < the 2 s between arrivals

    cfg = load_config(_cfg(tmp_path, "rates = [1, 2]\nload_requests = 30\nmax_in_flight = 1"), "load")

    def run(wait: dict) -> dict:
        rows = [{**r, "candidate": name, "rate": rate, "cap_wait_s": wait[rate]}
                for rate in (1.0, 2.0) for name, side in (("baseline", base), ("c", fast)) for r in side]
        (tmp_path / "load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        levels = [{"candidate": name, "rate": rate, "wall_s": 30.0 / rate, "requests": 30}
                  for rate in (1.0, 2.0) for name in ("baseline", "c")]
        (tmp_path / "load_levels.jsonl").write_text("".join(json.dumps(lv) + "\n" for lv in levels))
        summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
        apply(summary, cfg, tmp_path)
        return summary

    summary = run({1.0: 0.0, 2.0: 1.0})   # only the top level held back
    c = summary["load"]["crossover"]["c"]
    assert c["status"] == "pays up to" and c["rate"] == 1.0 and c["next"] == 2.0
    assert c["words"].startswith("c pays up to at least 1 req/s; not measured at 2 req/s (max_in_flight held")
    assert "not measured: max_in_flight held the baseline's requests back" in lines(summary)
    assert "pays at every level" not in lines(summary)
    summary = run({1.0: 2.0, 2.0: 1.0})   # every level held back: no crossover, and no "never pays" either
    c = summary["load"]["crossover"]["c"]
    assert c["words"].startswith("c is not shown to pay: not measured at 1 req/s, the lowest level tried")
    assert "crossover_rps" not in summary["candidates"]["c"]["metrics"]["load"]


# ------------------------------------------------------------------- red-team: load evidence

def test_a_request_without_a_usable_ttft_token_time_or_count_is_a_failed_request():
    """A TTFT of None crashed the verdict (TypeError); a NaN TTFT counted as a good request and made
    the baseline 'over capacity' (p95 nan); a negative TTFT passed a TTFT objective at p95 -5 s, and
    a TTFT past the E2E a TPOT objective at p95 -1.1 s."""
    from analysis.load import ok
    fine = row(0, 0.2, [0.05] * 3)
    assert ok(fine) and good(fine, {"ttft_p95_s": 1.0, "tpot_p95_s": 1.0})
    for bad in ({"ttft_s": None}, {"ttft_s": float("nan")}, {"ttft_s": -5.0}, {"ttft_s": fine["e2e_s"] + 10},
                {"token_times_s": [0.2, float("nan"), 0.05, 0.05]}, {"token_times_s": [0.2, -0.05, 0.05, 0.05]},
                {"n_tokens": "4"}, {"n_tokens": True}):
        r = {**fine, **bad}
        assert not ok(r) and not good(r, {"ttft_p95_s": 1.0, "tpot_p95_s": 1.0}), bad
        assert level_metrics([r] * 3, duration_s=1.0)["errors"] == 3, bad
    slo = {"ttft_p95_s": 0.5, "tpot_p95_s": 0.05}
    base = [row(i, 0.1, [0.02] * 9) for i in range(80)]
    good_level = level_metrics(base, duration_s=10, slo=slo)
    for bad in ({"ttft_s": -5.0}, {"ttft_s": 10.0}, {"ttft_s": float("nan")}):
        cand = level_metrics([{**r, **bad} for r in base], duration_s=10, slo=slo)
        assert [level_outcome(k, good_level, cand)[0] for k in slo] == ["fail", "fail"], bad


def _write_level(tmp_path, sides: dict, *, rates=(1.0,), requests: int, extra: dict | None = None) -> Path:
    """load.jsonl and load_levels.jsonl from {decoder: rows} at each rate (every side at every rate)."""
    import json
    rows = [{**r, "candidate": name, "rate": rate, **(extra or {})} for rate in rates
            for name, side in sides.items() for r in side]
    (tmp_path / "load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    levels = [{"candidate": name, "rate": rate, "wall_s": requests / rate, "requests": requests}
              for rate in rates for name in sides]
    (tmp_path / "load_levels.jsonl").write_text("".join(json.dumps(lv) + "\n" for lv in levels))
    return tmp_path


def test_duplicated_request_rows_are_no_evidence(tmp_path):
    """30 requests played, each row in load.jsonl twice: n = 60 made an upper bound on the p95 'exist'
    (it needs 59 requests) and the SLO gate, the errors gate and the crossover all passed."""
    from harness.verdict.load import apply
    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 30\n[profiles.load.slo]\nttft_p95_s = 1.0"), "load")
    base = [row(i, 0.2, [0.1] * 9) for i in range(30)]
    fast = [row(i, 0.1, [0.05 + 0.001 * (i % 3)] * 9) for i in range(30)]
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    assert not apply(summary, cfg, _write_level(tmp_path, {"baseline": base, "c": fast + fast}, requests=30))
    gates = {g["name"]: g for g in summary["candidates"]["c"]["gates"]}
    assert gates["load errors"]["status"] == "fail"
    assert "30 of the candidate's rows repeat a request already counted" in gates["load errors"]["detail"]
    assert gates["slo ttft_p95_s"]["status"] != "pass" and "repeat" in gates["slo ttft_p95_s"]["detail"]
    assert not judge_level(base, fast + fast, duration_s=30)["pays"]
    assert not judge_level(base + base[:1], fast, duration_s=30)["pays"]   # the baseline's rows too
    assert judge_level(base, fast, duration_s=30)["pays"]


def test_a_level_the_load_generator_sent_late_is_not_judged_at_its_rate(tmp_path):
    """The client could not keep the open-loop schedule (request i left at 2i + 3 s for an offset of
    i s: half the rate asked). The level was judged at 1 req/s: 'pays at every level tried (up to
    1 req/s)' and the SLO passed, with nothing in the verdict saying the rate was not offered."""
    from harness.verdict.load import apply, lines
    base = [row(i, 0.1, [0.1] * 9) for i in range(60)]
    fast = [row(i, 0.05, [0.05 + 0.001 * (i % 3)] * 9) for i in range(60)]
    def late(rows, lag):
        return [{**r, "offset_s": float(r["index"]), "lag_s": lag(r["index"]), "cap_wait_s": 0.0} for r in rows]
    j = judge_level(late(base, lambda i: 3.0 + i), late(fast, lambda i: 3.0 + i), duration_s=120, rate=1.0)
    assert j["pays"] is None and "sent the baseline's requests late" in j["why"]
    assert judge_level(base, late(fast, lambda i: 3.0 + i), duration_s=120, rate=1.0)["pays"] is None
    # On time (a few ms late) it is judged as before.
    assert judge_level(late(base, lambda i: 0.002), late(fast, lambda i: 0.002), duration_s=60, rate=1.0)["pays"]

    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 60\n[profiles.load.slo]\nttft_p95_s = 1.0"), "load")
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    folder = _write_level(tmp_path, {"baseline": late(base, lambda i: 3.0 + i), "c": late(fast, lambda i: 3.0 + i)},
                          requests=60)
    assert not apply(summary, cfg, folder)
    [gate] = [g for g in summary["candidates"]["c"]["gates"] if g["name"] == "slo ttft_p95_s"]
    assert gate["status"] == "fail" and "1 req/s: INCONCLUSIVE" in gate["detail"] and "sent the" in gate["detail"]
    c = summary["load"]["crossover"]["c"]
    assert c["words"].startswith("c is not shown to pay: not measured at 1 req/s")
    assert "pays at every level" not in lines(summary)


def test_a_configured_level_without_the_baseline_is_not_a_pass(tmp_path):
    """The baseline's level at 2 req/s missing from the run folder: nothing to compare the candidate
    with there, yet the errors gate passed 'at 2 level(s)'."""
    import json

    from harness.verdict.load import apply
    cfg = load_config(_cfg(tmp_path, "rates = [1, 2]\nload_requests = 30"), "load")
    base = [row(i, 0.1, [0.1] * 9) for i in range(30)]
    fast = [row(i, 0.05, [0.05 + 0.001 * (i % 3)] * 9) for i in range(30)]
    folder = _write_level(tmp_path, {"baseline": base, "c": fast}, rates=(1.0, 2.0), requests=30)
    for name in ("load.jsonl", "load_levels.jsonl"):   # drop the baseline's 2 req/s level
        kept = [r for r in map(json.loads, (folder / name).read_text().splitlines())
                if not (r["candidate"] == "baseline" and r["rate"] == 2.0)]
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in kept))
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    assert not apply(summary, cfg, folder)
    [gate] = [g for g in summary["candidates"]["c"]["gates"] if g["name"] == "load errors"]
    assert gate["status"] == "fail" and "2 req/s: no baseline requests" in gate["detail"]


def test_a_p95_that_interpolates_onto_a_failed_request_is_not_a_number_of_seconds():
    """72 requests, 3 refused: the median-unbiased p95 lies 5% of the way from the slowest answer to
    the stand-in for 'never answered', and was reported as a p95 of 5e+298 s ("the baseline's p95
    5e+298 s > 0.5 s") instead of the baseline's failures."""
    b = p95_bound([0.1] * 69 + [None] * 3)
    assert b["p95"] is None and b["bound"] == "on failed requests"
    for n in range(59, 160):   # every size: a p95 is either a time some request took, or None
        for failures in range(0, 6):
            b = p95_bound([0.01 * i for i in range(n - failures)] + [None] * failures)
            assert b["p95"] is None or b["p95"] <= 0.01 * (n - failures - 1), (n, failures, b)
    rows = [row(i, 0.1, [0.01]) for i in range(69)] + [row(69 + i, 0, [], error="HTTP 503") for i in range(3)]
    m = level_metrics(rows, duration_s=10, slo={"ttft_p95_s": 0.5})
    assert level_outcome("ttft_p95_s", m, m) == ("over capacity", "the baseline failed 3 of 72 requests")


def test_impossible_per_request_acceptance_counts_are_refused_not_published():
    """A request that reported 12 accepted of 10 proposed: the level's α per token and per request
    were published as 1.2 (negative counts as a level without α, silently)."""
    for stats in ({"proposed": 10, "accepted": 12}, {"proposed": -10, "accepted": -5}, {"proposed": 10, "accepted": -1}):
        rows = [row(i, 0.1, [0.01] * 5, stats={"telemetry": "per-request", "proposed": 10, "accepted": 4})
                for i in range(4)]
        rows.append(row(4, 0.1, [0.01] * 5, stats={"telemetry": "per-request", **stats}))
        acc = level_metrics(rows, duration_s=1.0)["acceptance"]
        assert "per_token" not in acc and "per_request" not in acc, (stats, acc)
        assert "1 of 5 requests reported impossible counts" in acc["error"]
    acc = level_metrics(rows[:4], duration_s=1.0)["acceptance"]
    assert acc["per_token"]["value"] == pytest.approx(0.4) and "error" not in acc


def test_an_engine_candidate_without_any_load_level_is_not_a_pass(tmp_path):
    """load.jsonl and load_levels.jsonl held the baseline's level only: the engine candidate, which
    the load phase plays at every rate, got no load gate at all and kept its 'pass'."""
    from harness.verdict.load import apply
    cfg = load_config(_cfg(tmp_path, "rates = [1]\nload_requests = 30"), "load")
    folder = _write_level(tmp_path, {"baseline": [row(i, 0.1, [0.1] * 9) for i in range(30)]}, requests=30)
    summary = {"baseline": "baseline", "candidates": {"c": {"verdict": "pass", "gates": []}}}
    assert not apply(summary, cfg, folder)
    [gate] = [g for g in summary["candidates"]["c"]["gates"] if g["name"] == "load errors"]
    assert gate["status"] == "fail" and "1 req/s: no candidate requests" in gate["detail"]
    assert summary["candidates"]["c"]["verdict"] == "fail"


def test_failed_requests_fail_a_level_the_generator_could_not_keep_up_with():
    """A level whose requests the engine failed (a killed server) fails, even where the client lagged:
    its lag cannot make a request fail. Before, CI's loaded run of test_load_engine read such a level
    as "not judged" (send lag p99 52 ms > 50 ms) and the 32 failures were not its verdict. Rows lost
    with a client worker are the harness's failure: the level stays unjudged."""
    from analysis.load import LOST_WORKER
    base = [{**row(k, 0.1, [0.1] * 9), "offset_s": float(k), "lag_s": 0.2} for k in range(32)]
    failed = [{**row(k, 0.1, [], error="engine 'ngram' stopped answering"), "offset_s": float(k), "lag_s": 0.2}
              for k in range(32)]
    j = judge_level(base, failed, duration_s=10, rate=1.0)
    assert j["pays"] is False and "32 of 32 requests failed" in j["why"], j["why"]
    lost = [{**r, "error": f"{LOST_WORKER}: worker 1 died"} for r in failed]
    j = judge_level(base, lost, duration_s=10, rate=1.0)
    assert j["pays"] is None and "could not keep up" in j["why"], j["why"]
