"""Concurrency levels and the A/A floor, as plain renamings of the lineup.

An engine is judged under load: `concurrency = [1, 4, 16]` in a profile runs the baseline and
every engine candidate at each level, and each level is its own paired comparison (candidate
`spec@c4` against baseline `base@c4`). At each level the baseline also runs a second time
(`base~aa@c4`, role "aa-floor"): how far the engine's own margins move, and how often it
flips a token, is the floor an exact candidate is judged against (harness.verdict.floor).
In-process decoders are batch-1 and deterministic: they run once, at no level, and get no A/A run.

Everything else (records, resume, summary, gates, MLflow) sees ordinary candidate names.
"""
from __future__ import annotations

import dataclasses

from harness.config import DecoderSpec, RegressConfig

AA = "~aa"


def is_engine(spec: DecoderSpec) -> bool:
    return isinstance(spec.options.get("engine"), str)


def levels(config: RegressConfig) -> list[int | None]:
    """Concurrency levels to run; [None] when the profile sweeps nothing."""
    if config.profile.concurrency and any(is_engine(s) for s in (config.baseline, *config.candidates)):
        return list(config.profile.concurrency)
    return [None]


def _at(spec: DecoderSpec, level: int | None, suffix: str = "", role: str | None = None) -> DecoderSpec:
    name = spec.name + suffix + (f"@c{level}" if level is not None else "")
    options = dict(spec.options)
    # `aa_engine`: the A/A run on another server (e.g. other threads or batch sizes), to see
    # what really changes the engine's numerics; by default the baseline's own engine.
    aa_engine = options.pop("aa_engine", None)
    if role == "aa-floor" and aa_engine:
        options["engine"] = aa_engine
    if level is not None and is_engine(spec):
        options["concurrency"] = level
    return dataclasses.replace(spec, name=name, options=options, role=role or spec.role)


def level_config(config: RegressConfig, level: int | None) -> RegressConfig:
    """The config of one level: its baseline, its A/A run (engine baselines), its candidates."""
    swept = level is not None
    base = _at(config.baseline, level if swept else None)
    cands = [_at(c, level if swept and is_engine(c) else None) for c in config.candidates
             if not swept or is_engine(c) or level == config.profile.concurrency[0]]
    if is_engine(config.baseline):
        cands.insert(0, _at(config.baseline, level, AA, role="aa-floor"))
    return dataclasses.replace(config, baseline=base, candidates=tuple(cands))


def all_specs(config: RegressConfig) -> list[DecoderSpec]:
    """Every spec the run generates with, across levels, each once."""
    out, seen = [], set()
    for level in levels(config):
        cfg = level_config(config, level)
        for spec in (cfg.baseline, *cfg.candidates):
            if spec.name not in seen:
                seen.add(spec.name)
                out.append(spec)
    return out


def throughput(rows: list[dict]) -> float | None:
    """Generated tokens per second across all requests of one decoder at one level: tokens over
    the time its request blocks kept the engine busy (first start to last finish per block)."""
    blocks: dict = {}
    for r in rows:
        t = r.get("timing") or {}
        if r.get("tokens") and r.get("finished_at") is not None and t.get("wall_s") is not None:
            lo, hi, n = blocks.get(r.get("block"), (float("inf"), float("-inf"), 0))
            blocks[r.get("block")] = (min(lo, r["finished_at"] - t["wall_s"]), max(hi, r["finished_at"]),
                                      n + len(r["tokens"]))
    busy = sum(hi - lo for lo, hi, _ in blocks.values())
    return sum(n for *_, n in blocks.values()) / busy if busy > 0 else None


def sweep_table(config: RegressConfig, summary: dict, records: list[dict]) -> list[dict]:
    """Per candidate and level: throughput, latency p50/p95, TTFT, inter-token latency, speedup
    with its interval, α/τ, and the A/A floor."""
    by_name: dict = {}
    for r in records:
        by_name.setdefault(r["candidate"], []).append(r)
    out = []
    for level in levels(config):
        if level is None:
            continue
        cfg = level_config(config, level)
        # Throughput compares like with like: the items the baseline was timed on in this run (all,
        # or the speed sample where the rest came from the store), on both sides.
        from harness.run.speed_sample import key_of_row, rests_on
        base_timed = {key_of_row(r): r for r in rests_on(by_name.get(cfg.baseline.name, []))}
        aa = summary["candidates"].get(f"{config.baseline.name}{AA}@c{level}", {})
        floor_rate, aa_floor = _divergence_rate(aa), aa.get("floor") or {}
        for spec in cfg.candidates:
            if spec.role == "aa-floor":
                continue
            cand = summary["candidates"].get(spec.name, {})
            rows = [r for r in by_name.get(spec.name, []) if r.get("tokens")]
            walls = [r["timing"]["wall_s"] for r in rows]
            ttft = [r["timing"]["ttft_s"] for r in rows]
            itl = [x for r in rows for x in (r["timing"].get("token_times_s") or [])[1:]]
            sp, acc = cand.get("speedup") or {}, cand.get("acceptance") or {}
            same = [r for r in rows if key_of_row(r) in base_timed]
            tp = throughput(same)
            base_tp = throughput([base_timed[key_of_row(r)] for r in same])
            out.append({
                "candidate": config_name(spec.name), "level": level, "n": len(rows),
                "throughput_tok_s": tp, "baseline_throughput_tok_s": base_tp, "throughput_n": len(same),
                "throughput_ratio": tp / base_tp if tp and base_tp else None,
                "latency_p50_s": _q(walls, 50), "latency_p95_s": _q(walls, 95),
                "ttft_p50_s": _q(ttft, 50), "ttft_p95_s": _q(ttft, 95), "itl_p50_s": _q(itl, 50),
                "speedup": sp.get("statistic"), "speedup_ci": [sp.get("ci_low"), sp.get("ci_high")],
                "alpha": acc.get("alpha"), "tau": acc.get("tau"),
                "aa_floor_rate": floor_rate, "divergence_rate": _divergence_rate(cand),
                # the engine's own margin noise at this level, and whether its A/A run is a floor
                "aa_noise": aa_floor.get("scale"), "aa_floor_valid": aa_floor.get("valid"),
            })
    return out


def config_name(name: str) -> str:
    return name.rsplit("@c", 1)[0]


def _q(xs: list[float], q: float) -> float | None:
    import numpy as np
    return float(np.percentile(xs, q)) if xs else None


def _divergence_rate(cand: dict) -> float | None:
    n = div = 0
    for s in (cand.get("suites") or {}).values():
        ident = (s.get("identity") or {}).get("T=0")
        if ident:
            n += ident["n"]
            div += ident["n"] - ident["identical"]
    return div / n if n else None


def figure(table: list[dict], path) -> None:
    """Speedup and p95 latency against concurrency, one line per candidate."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name in sorted({r["candidate"] for r in table}):
        rows = sorted((r for r in table if r["candidate"] == name), key=lambda r: r["level"])
        xs = [r["level"] for r in rows]
        a.errorbar(xs, [r["speedup"] or float("nan") for r in rows], marker="o", label=name,
                   yerr=[[max((r["speedup"] or 0) - (r["speedup_ci"][0] or r["speedup"] or 0), 0) for r in rows],
                         [max((r["speedup_ci"][1] or r["speedup"] or 0) - (r["speedup"] or 0), 0) for r in rows]])
        b.plot(xs, [r["latency_p95_s"] or float("nan") for r in rows], marker="o", label=name)
    a.axhline(1.0, color="grey", lw=0.8)
    a.set(xscale="log", xlabel="concurrency", ylabel="speedup (paired, 95% CI)", title="speedup vs load")
    b.set(xscale="log", xlabel="concurrency", ylabel="p95 request latency (s)", title="p95 vs load")
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
