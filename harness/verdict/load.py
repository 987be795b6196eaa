"""The load phase's verdict: per level and decoder the metrics users size by, the paired speedup,
the SLO gates (harness.verdict.slo), each candidate's crossover, and the harness's own overhead.

`apply(summary, config, run_dir)` reads `load.jsonl` and `load_levels.jsonl` (harness.run.load),
puts the numbers in `summary["load"]` (and each candidate's `load` and MLflow `metrics`), adds
the failed-request gate and the SLO gates to each candidate's gates, draws `figures/load.png` and returns whether every
new gate passed. `lines(summary)` is the report's section. Every number comes from
analysis.load; this module only arranges them and decides.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.load import crossover, generator_limit, held_back, judge_level, level_metrics, sent_late
from harness.run.records import LOAD, LOAD_LEVELS as LEVELS, read_records
from harness.verdict import slo as slo_gates

OVERHEAD_LIMIT = 0.05  # the harness's CPU per request, as a share of the median E2E at the top level

NOTES = (
    "TPOT is (E2E - TTFT) / (tokens - 1) per request; ITL is the gap before each token. A speculative "
    "engine streams a round's accepted drafts together (gaps near zero, the round's cost on one gap), "
    "so ITL misstates speculation; size by TPOT.",
    "α per token = Σ accepted / Σ proposed (leans toward long completions); α per request = the mean of "
    "each request's own rate; both from per-request telemetry. α (level) is the engine's Prometheus "
    "counters differenced around the whole level: many requests were in flight, so it is the level's, "
    "never a request's.",
)


def summarize(config, rows: list[dict], levels: list[dict], baseline: str, timing_bias: str | None = None) -> dict:
    """Every level's numbers, the crossovers and the overhead (see the module docstring).
    `timing_bias` (harness.verdict.timing.bias): the run's A/A timing excluded a speedup of 1,
    so no level is evidence that a candidate pays: each is "not measured", with that reason."""
    plan = config.profile.load
    slo, alpha = plan.slo.items(), config.gates.alpha
    by = {}
    for r in rows:
        by.setdefault((r["candidate"], r["rate"]), []).append(r)
    info = {(lv["candidate"], lv["rate"]): lv for lv in levels}
    rates = sorted({rate for _, rate in info})
    names = [baseline] + list(dict.fromkeys(lv["candidate"] for lv in levels if lv["candidate"] != baseline))
    table, judged = [], {n: [] for n in names[1:]}
    for rate in rates:
        for name in names:
            lv = info.get((name, rate))
            if lv is None:
                continue
            entry = _level_entry(name, rate, lv, by, info, baseline, slo=slo, alpha=alpha, timing_bias=timing_bias)
            if name != baseline and (baseline, rate) in info:
                judged[name].append((rate, entry["pays"], entry["why"]))
            table.append(entry)
    for entry in table:
        if entry["role"] == "baseline":
            entry["metrics"]["after_unanswered"] = _unanswered_before(levels, by, baseline, entry["rate"])
    top = max(rates) if rates else None
    overhead = _overhead(table, top)
    shares = [o["share_of_e2e"] for o in overhead.values() if o["share_of_e2e"] is not None]
    return {"baseline": baseline, "rates": rates, "configured_rates": list(plan.rates),
            "refined": sorted({lv["rate"] for lv in levels if lv.get("refine")}), "refine_budget": plan.refine_levels,
            "requests": plan.requests, "burstiness": plan.burstiness, "max_in_flight": plan.max_in_flight,
            "seed": plan.seed, "slo": slo, "alpha": alpha, "levels": table, "crossover": _crossovers(judged),
            "overhead": {"rate": top, "by_decoder": overhead, "max_share": max(shares) if shares else None,
                         "limit": OVERHEAD_LIMIT}, "notes": list(NOTES)}


def _level_entry(name: str, rate: float, lv: dict, by: dict, info: dict, baseline: str, *, slo, alpha,
                 timing_bias) -> dict:
    """One decoder at one level: the harness's own figures, the metrics, and for a candidate the
    paired speedup and whether it pays against the baseline at the same rate."""
    entry = {"rate": rate, "decoder": name, "role": "baseline" if name == baseline else "candidate",
             "refine": bool(lv.get("refine")), "harness": {k: lv.get(k) for k in (
                 "wall_s", "harness_cpu_per_request_s", "harness_cpu_per_token_s", "loop_busy_share",
                 "lag_p50_s", "lag_p99_s", "lag_max_s", "most_in_flight", "client_workers")}}
    if name == baseline:
        entry["metrics"] = level_metrics(by.get((name, rate), []), duration_s=lv["wall_s"], slo=slo,
                                         alpha=alpha, prometheus=lv.get("prometheus"))
    else:
        j = judge_level(by.get((baseline, rate), []), by.get((name, rate), []), duration_s=lv["wall_s"], slo=slo,
                        alpha=alpha, prometheus=lv.get("prometheus"), rate=rate, base_level=info.get((baseline, rate)),
                        cand_level=lv)
        if timing_bias:
            j["pays"], j["why"] = None, timing_bias
        entry.update(metrics=j["metrics"], speedup=j["speedup"], pays=j["pays"], why=j["why"])
    mine = by.get((name, rate), [])
    entry["metrics"].update(scheduled=lv.get("requests"), held_back=held_back(mine, rate),
                            sent_late=sent_late(mine, rate), generator=generator_limit(mine, lv))
    return entry


def _crossovers(judged: dict) -> dict:
    """Per candidate: the rate where it stops paying (analysis.load.crossover), in words, and the
    levels not measured."""
    crossovers = {}
    for name, js in judged.items():
        c = crossover([(rate, paid) for rate, paid, _ in js])
        why = {rate: w for rate, _, w in js}
        unmeasured = {rate for rate, paid, _ in js if paid is None}
        crossovers[name] = {**c, "words": _words(name, c, why, unmeasured), "not_measured": sorted(unmeasured)}
    return crossovers


def _overhead(table: list[dict], top) -> dict:
    """Per decoder at the top level: the harness's CPU per request as a share of the median E2E."""
    overhead = {}
    for e in (e for e in table if e["rate"] == top):
        e2e = (e["metrics"].get("e2e") or {}).get("p50")
        cpu = e["harness"].get("harness_cpu_per_request_s")
        overhead[e["decoder"]] = {"harness_cpu_per_request_s": cpu, "e2e_p50_s": e2e,
                                  "share_of_e2e": cpu / e2e if cpu is not None and e2e else None,
                                  "lag_max_s": e["harness"].get("lag_max_s"),
                                  "loop_busy_share": e["harness"].get("loop_busy_share")}
    return overhead


# Errors that leave no work on an engine (harness.run.load writes "HTTP <status>: ..." for a
# refusal and "<exception type>: ..." otherwise): a refusal the engine answered, a connection that
# never opened, an engine whose process had exited. A timeout or a dropped stream may leave work.
LEFT_NO_WORK = ("HTTP ", "ConnectError:", "ConnectTimeout:", "PoolTimeout:", "DecoderError:")


def _unanswered_before(levels: list[dict], by: dict, baseline: str, rate: float) -> list[dict]:
    """The decoders played between the baseline's previous level and its level at `rate` (in the
    order load_levels.jsonl was written, the order played) with requests that ended unanswered (an
    error not in LEFT_NO_WORK: a timeout, a dropped stream). Their engine may still have been working
    on them when the baseline played, on an accelerator it may share (harness.verdict.slo)."""
    since = []
    for lv in levels:
        if lv["candidate"] == baseline:
            if lv["rate"] == rate:
                return [x for x in since if x["requests"]]
            since = []
            continue
        lost = [r for r in by.get((lv["candidate"], lv["rate"]), [])
                if r.get("error") and not str(r["error"]).startswith(LEFT_NO_WORK)]
        since.append({"decoder": lv["candidate"], "rate": lv["rate"], "requests": len(lost),
                      "first": lost[0]["error"] if lost else None})
    return []


def _words(name: str, c: dict, why: dict, unmeasured: set = frozenset()) -> str:
    if c["status"] == "pays at every level tried":
        return f"{name} pays at every level tried (up to {c['rate']:g} req/s)"
    # A level max_in_flight held back is not measured: no loss shown there, and no crossover either.
    if c["status"] == "never pays" and c["next"] in unmeasured:
        return (f"{name} is not shown to pay: not measured at {c['next']:g} req/s, the lowest level tried "
                f"({why[c['next']]})")
    if c["status"] == "pays up to" and c["next"] in unmeasured:
        return (f"{name} pays up to at least {c['rate']:g} req/s; not measured at {c['next']:g} req/s "
                f"({why[c['next']]})")
    if c["status"] == "never pays":
        # "Pays" needs a speedup bound above 1; below it is "not shown to pay", not a shown loss.
        return (f"{name} is not shown to pay at any level tried: not even at {c['next']:g} req/s, the lowest "
                f"({why[c['next']]})")
    if c["status"] == "pays up to":
        return f"{name} pays up to about {c['rate']:g} req/s (at {c['next']:g} req/s: {why[c['next']]})"
    return f"{name}: no load level with a baseline to pair with"


def apply(summary: dict, config, run_dir: Path) -> bool:
    """Attach the load verdict to `summary` (see the module docstring); True when every new gate passed."""
    rows, levels = read_records(run_dir, LOAD), read_records(run_dir, LEVELS)
    base_name = next((lv["candidate"] for lv in levels if lv["candidate"] == summary["baseline"]
                      or lv["candidate"].startswith(summary["baseline"] + "@c")), summary["baseline"])
    from harness.verdict import timing
    passed = timing.apply(summary, config.gates)   # idempotent: the closed loop's speed gates too
    load = summarize(config, rows, levels, base_name, timing_bias=timing.bias(summary))
    summary["load"] = load
    slo = load["slo"]
    from harness.run.load import load_specs
    played = {s.name for s in load_specs(config, None)[1:]}  # every engine candidate plays every rate
    for name, cand in summary["candidates"].items():
        if name not in played and name not in load["crossover"] and not any(e["decoder"] == name
                                                                             for e in load["levels"]):
            continue
        # Every configured rate is gated (a candidate missing there fails, even with no level in
        # the files at all); a bracketing level only for the candidates it was run for.
        mine = [{"rate": r, "baseline": _metrics(load, base_name, r), "candidate": _metrics(load, name, r)}
                for r in sorted(set(load["rates"]) | set(load["configured_rates"]))
                if r in load["configured_rates"] or _metrics(load, name, r) is not None]
        cand["load"] = {"crossover": load["crossover"].get(name)}
        cand.setdefault("metrics", {})["load"] = mlflow_metrics(load, name, base_name)
        # Failed requests are gated with or without objectives: an engine that died under load
        # must not pass on the gates of the unloaded run.
        results = [slo_gates.error_gate(mine, config.gates)]
        if slo:
            results += slo_gates.gates(mine, slo, config.gates)
        cand["gates"] = list(cand.get("gates") or []) + [
            {"name": g.name, "status": g.status, "detail": g.detail} for g in results]
        if any(g.status == "fail" for g in results):
            cand["verdict"], passed = "fail", False
    try:
        from analysis.load_figure import load_figure
        load_figure(load, Path(run_dir) / "figures" / "load.png")
    except Exception as e:  # noqa: BLE001 - a figure is never worth a run
        print(f"decodegate: warning: load figure not drawn ({e})", file=sys.stderr)
    return passed


def _metrics(load: dict, name: str, rate: float) -> dict | None:
    return next((e["metrics"] for e in load["levels"] if e["decoder"] == name and e["rate"] == rate), None)


def _q(m: dict, metric: str, q: str):
    return ((m or {}).get(metric) or {}).get(q)


def mlflow_metrics(load: dict, name: str, baseline: str) -> dict:
    """The candidate's numbers per level (and the baseline's beside them), for its MLflow run."""
    out: dict = {}
    for e in load["levels"]:
        if e["decoder"] not in (name, baseline):
            continue
        prefix = "" if e["decoder"] == name else "baseline_"
        m = e["metrics"]
        level = out.setdefault(f"r{e['rate']:g}", {})
        for metric in ("ttft", "tpot", "itl", "e2e"):
            for q in ("p50", "p90", "p99"):
                if _q(m, metric, q) is not None:
                    level[f"{prefix}{metric}_{q}_s"] = _q(m, metric, q)
        level[f"{prefix}output_tok_s"] = (m.get("output_throughput_tok_s") or {}).get("value")
        level[f"{prefix}goodput_rps"] = (m.get("goodput_rps") or {}).get("value")
        level[f"{prefix}errors"] = m.get("errors")
        if e["decoder"] == name and e.get("speedup"):
            level["speedup"] = e["speedup"]["statistic"]
            level["speedup_lower_bound"] = e["speedup"]["lower_bound"]
            if e.get("pays") is not None:  # absent where the level was not measured (held back)
                level["pays"] = bool(e["pays"])
        acc = m.get("acceptance") or {}
        for key in ("per_token", "per_request", "level"):
            if key in acc:
                level[f"{prefix}alpha_{key}"] = acc[key]["value"]
    c = load["crossover"].get(name) or {}
    if c.get("status") == "pays up to" or c.get("status") == "pays at every level tried":
        out["crossover_rps"] = c["rate"]
    elif c.get("status") == "never pays" and c["next"] not in c.get("not_measured", ()):
        out["crossover_rps"] = 0.0  # not where the lowest level was not measured: nothing shown there
    return out


# ----------------------------------------------------------------------------------------- report

def _f(x, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _ci(pair, spec: str = ".3f") -> str:
    lo, hi = pair or (None, None)
    return f"[{_f(lo, spec)}, {_f(hi, spec)}]"


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def lines(summary: dict) -> str:
    """The report's load section: latency and speed tables, SLOs, crossovers, overhead, notes."""
    load = summary.get("load")
    if not load:
        return ""
    out = [f"\n\nopen-loop load ({load['requests']} requests per level, gamma arrivals with burstiness "
           f"{load['burstiness']:g}{' (Poisson)' if load['burstiness'] == 1 else ''}, seed {load['seed']}"
           + (f", at most {load['max_in_flight']} in flight" if load["max_in_flight"] else "")
           + f"; the same items at the same offsets for every decoder; intervals 95% over prompts, speedup "
             f"lower bounds one-sided {1 - load['alpha']:.0%}):"]
    out += _table(_latency_rows(load))
    out += [""] + _table(_speed_rows(load))
    if load["refined"]:
        out.append(f"* a bracketing level ({len(load['refined'])} of a budget of {load['refine_budget']})")
    out += _slo_lines(load)
    out.append("crossover (the highest load up to which every level paid: speedup lower bound >= 1, no failed "
               "request, SLOs met):")
    out += [f"  {c['words']}" for c in load["crossover"].values()]
    out += _overhead_lines(load)
    out += _generator_lines(load)
    out += [f"note: {n}" for n in load["notes"]]
    return "\n".join(out)


def _latency_rows(load: dict) -> list[tuple]:
    """The latency table: per level and decoder, TTFT, TPOT, ITL and E2E quantiles with intervals."""
    lat = [("decoder", "req/s", "n (err)", "TTFT p50 [CI] / p90", "TPOT p50 [CI] / p90", "ITL p50 / p90",
            "E2E p50 [CI] / p90 / p99")]
    for e in load["levels"]:
        m = e["metrics"]
        p99 = _q(m, "e2e", "p99")
        lat.append((e["decoder"], f"{e['rate']:g}" + ("*" if e["refine"] else ""), f"{m['n']} ({m['errors']})",
                    f"{_f(_q(m, 'ttft', 'p50'))} {_ci(_q(m, 'ttft', 'p50_ci'))} / {_f(_q(m, 'ttft', 'p90'))}",
                    f"{_f(_q(m, 'tpot', 'p50'), '.4f')} {_ci(_q(m, 'tpot', 'p50_ci'), '.4f')} / "
                    f"{_f(_q(m, 'tpot', 'p90'), '.4f')}",
                    f"{_f(_q(m, 'itl', 'p50'), '.4f')} / {_f(_q(m, 'itl', 'p90'), '.4f')}",
                    f"{_f(_q(m, 'e2e', 'p50'))} {_ci(_q(m, 'e2e', 'p50_ci'))} / {_f(_q(m, 'e2e', 'p90'))} / "
                    + (_f(p99) if p99 is not None else f"– (n {(m.get('e2e') or {}).get('n', 0)} < "
                                                          f"{(m.get('e2e') or {}).get('p99_needs_n', 100)})")))
    return lat


def _speed_rows(load: dict) -> list[tuple]:
    """The speed table: throughput, goodput, the paired speedup, α, and whether the level paid."""
    spd = [("decoder", "req/s", "out tok/s [CI]", "goodput req/s [CI]", "speedup [CI] (lower bound)",
            "α per token / per request / level", "pays")]
    for e in load["levels"]:
        m, sp = e["metrics"], e.get("speedup")
        tp, gp, acc = m.get("output_throughput_tok_s") or {}, m.get("goodput_rps"), m.get("acceptance") or {}
        spd.append((e["decoder"], f"{e['rate']:g}" + ("*" if e["refine"] else ""),
                    f"{_f(tp.get('value'), '.1f')} {_ci(tp.get('ci'), '.1f')}",
                    f"{_f(gp['value'], '.2f')} {_ci(gp['ci'], '.2f')}" if gp else "– (no SLO)",
                    (f"{_f(sp['statistic'], '.2f')}x {_ci(sp['ci'], '.2f')} ({_f(sp['lower_bound'], '.2f')})" if sp
                     else ("baseline" if e["role"] == "baseline" else "–")),
                    " / ".join(_f((acc.get(k) or {}).get("value"), ".2f")
                               for k in ("per_token", "per_request", "level")),
                    "" if e["role"] == "baseline" else (
                        "yes" if e.get("pays") else
                        f"{'not measured' if e.get('pays') is None else 'no'}: {e.get('why')}")))
    return spd


def _slo_lines(load: dict) -> list[str]:
    """The SLOs, and the levels where the baseline misses one (over capacity: not gated)."""
    out = []
    if load["slo"]:
        out.append("SLOs (p95, gated on the candidate's upper bound where the baseline meets them): "
                   + ", ".join(f"{k} = {v:g} s" for k, v in load["slo"].items()))
        for e in (e for e in load["levels"] if e["role"] == "baseline"):
            over = [k for k, s in (e["metrics"].get("slo") or {}).items() if not s["point_meets"]]
            if over:
                out.append(f"  {e['rate']:g} req/s: over capacity for {', '.join(over)} (the baseline misses it): "
                           f"not gated")
    return out


def _overhead_lines(load: dict) -> list[str]:
    """The harness's own CPU per request at the top level, flagged above its limit."""
    out = []
    ov = load["overhead"]
    if ov["by_decoder"]:
        worst = ov["max_share"]
        out.append(f"harness overhead at {ov['rate']:g} req/s (the event loop's CPU per request over the median E2E): "
                   + ", ".join(f"{n} {_f(1e3 * (o['harness_cpu_per_request_s'] or 0), '.2f')} ms "
                               f"({_f(100 * o['share_of_e2e'] if o['share_of_e2e'] is not None else None, '.2f')}%), "
                               f"latest send {_f(1e3 * (o['lag_max_s'] or 0), '.1f')} ms late"
                               for n, o in ov["by_decoder"].items())
                   + ("" if worst is None or worst < ov["limit"] else
                      f"; ABOVE {ov['limit']:.0%}: the load generator may be the bottleneck"))
    return out


def _generator_lines(load: dict) -> list[str]:
    """The load generator per level: its CPU per request and token, its send lag, and the levels
    where it could not keep up (not judged: analysis.load.generator_limit)."""
    rows = [("decoder", "req/s", "client workers", "CPU ms/request", "CPU µs/token", "loop busy", "lag p50 / p99 ms",
             "kept up")]
    for e in load["levels"]:
        g = e["metrics"].get("generator") or {}
        rows.append((e["decoder"], f"{e['rate']:g}", str(g.get("workers") or 1),
                     _f(None if g.get("cpu_per_request_s") is None else 1e3 * g["cpu_per_request_s"], ".2f"),
                     _f(None if g.get("cpu_per_token_s") is None else 1e6 * g["cpu_per_token_s"], ".1f"),
                     _f(None if g.get("busy_share") is None else 100 * g["busy_share"], ".0f") + "%",
                     f"{_f(None if g.get('lag_p50_s') is None else 1e3 * g['lag_p50_s'], '.1f')} / "
                     f"{_f(None if g.get('lag_p99_s') is None else 1e3 * g['lag_p99_s'], '.1f')}",
                     "NO: not judged" if g.get("limited") else "yes"))
    out = ["", "load generator (send lag: how late a request left against its offset; a level past a lag p99 of "
               "max(50 ms, 10% of its median TTFT) or a loop busy over 90% is not judged):"] + _table(rows)
    out += [f"  {e['decoder']} at {e['rate']:g} req/s: {e['metrics']['generator']['why']}" for e in load["levels"]
            if (e["metrics"].get("generator") or {}).get("limited")]
    return out
