"""The early-exit frontier: a threshold sweep, with and without exit heads, on the graded suites.

    decodegate exit-frontier --target smollm2-135m [--exit-heads DIR] [--calibrated CAL]
        [--thresholds 0.99,0.95,0.9,0.8,0.6] [--suites factual,code,refusal] [--subset smoke]

Each point is one early-exit candidate (a threshold through the logit lens, or through the heads,
or the calibrated thresholds), run against `standard` on the same suite items, greedy, interleaved
item by item (the regress runner: records.jsonl, resumable with the same --run-dir). Per point:
average layers, theoretical speedup (the LM-head checks counted), measured speedup against
`standard` with its paired bootstrap interval, greedy token agreement (identical outputs, and the
share of the baseline's tokens reproduced before the first divergence), and the quality delta per
graded suite with its interval (paired, as `regress` computes it). The run folder gets
frontier.json, frontier.txt and figures/frontier.png (speed against quality, Pareto points
joined); MLflow a copy. It is what a reviewer reads before picking a threshold.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m", help="target model (default: %(default)s)")
    p.add_argument("--exit-heads", help="exit heads folder: every threshold also runs through the heads")
    p.add_argument("--calibrated", action="append", default=[],
                   help="a calibrate-exits folder: one more point at its thresholds (repeatable)")
    p.add_argument("--thresholds", default="0.99,0.95,0.9,0.8,0.6",
                   help="softmax-confidence thresholds to sweep (default: %(default)s)")
    p.add_argument("--no-lens", action="store_true", help="with --exit-heads: skip the logit-lens points")
    p.add_argument("--suites", default="factual,code,refusal", help="suites to run (default: %(default)s)")
    p.add_argument("--subset", choices=("smoke", "full"), default="smoke", help="suite subset (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="cap on every item's budget (default: the suite's)")
    p.add_argument("--margin", type=float, default=0.10, help="non-inferiority margin on pass rates, for the "
                                                              "per-suite tests (default: %(default)s)")
    p.add_argument("--run-dir", help="run folder; an existing one is resumed (default: runs/<time>-frontier)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print frontier.json instead of the table")


def points(args) -> list[dict]:
    """The candidates of the sweep: name, options, and what they are (for the figure)."""
    from decoders.base import DecoderError
    try:
        ths = [float(x) for x in args.thresholds.split(",") if x.strip()]
    except ValueError:
        raise DecoderError(f"--thresholds takes comma-separated numbers, got {args.thresholds!r}") from None
    if any(not 0 <= t <= 1 for t in ths):
        raise DecoderError(f"--thresholds must be in [0, 1], got {args.thresholds!r}")
    if args.no_lens and not args.exit_heads:
        raise DecoderError("--no-lens needs --exit-heads (otherwise nothing is left to sweep)")
    out = []
    for t in ths:
        if not args.no_lens:
            out.append({"name": f"ee-lens-{t:g}", "series": "logit lens", "threshold": t, "options": {"threshold": t}})
        if args.exit_heads:
            out.append({"name": f"ee-heads-{t:g}", "series": "exit heads", "threshold": t,
                        "options": {"threshold": t, "exit_heads": str(Path(args.exit_heads).expanduser().resolve())}})
    for i, cal in enumerate(args.calibrated):
        from decoders.early_exit import load_calibration
        c = load_calibration(cal)   # fail now, not after an hour of generation
        th = next(iter(c["thresholds"].values()))
        out.append({"name": f"ee-calibrated-{i + 1}", "series": "calibrated", "threshold": th,
                    "epsilon": c.get("epsilon"), "delta": c.get("delta"),
                    "options": {"threshold": f"calibrated:{Path(cal).expanduser().resolve()}"}})
    if not out:
        raise DecoderError("nothing to sweep: give --thresholds or --calibrated")
    return out


def write_config(path: Path, args, pts: list[dict], suites: list[str]) -> None:
    """The sweep as a regress config (kept in the run folder: the run can be redone with
    `decodegate regress --config` too)."""
    def toml_value(v):
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(toml_value(x) for x in v) + "]"
        return repr(v)
    lines = [f"target = {toml_value(args.target)}", "", "[baseline]", 'name = "standard"', 'decoder = "standard"', ""]
    for pt in pts:
        lines += ["[[candidates]]", f"name = {toml_value(pt['name'])}", 'decoder = "early-exit"', 'kind = "lossy"',
                  f"options = {toml_value(pt['options'])}", ""]
    for s in suites:
        lines += [f"[suites.{s}]", f"margin = {args.margin!r}", ""]
    lines += ["[profiles.frontier]", f"subset = {toml_value(args.subset)}", f"suites = {toml_value(suites)}",
              "temperatures = [0.0]", f"sample_suites = {toml_value(suites)}", "seeds = [0]"]
    if args.max_new_tokens:
        lines.append(f"max_new_tokens = {int(args.max_new_tokens)}")
    path.write_text("\n".join(lines) + "\n")


def analyse(records: list[dict], pts: list[dict], graded: list[str], *, head_cost: float, margin: float) -> dict:
    """Per point: layers, speed (theory and measured), greedy agreement, quality per suite."""
    import numpy as np

    import analysis
    by = analysis.split_by_candidate(records)
    base = [r for r in by["standard"] if not r.get("error")]
    rng = np.random.default_rng(0)
    out = []
    for pt in pts:
        mine = [r for r in by.get(pt["name"], []) if not r.get("error")]
        keys = {(r["suite"], r["item_id"]) for r in mine} & {(r["suite"], r["item_id"]) for r in base}
        b = [r for r in base if (r["suite"], r["item_id"]) in keys]
        c = [r for r in mine if (r["suite"], r["item_id"]) in keys]
        pairs = analysis.pair_records(b, c)
        ex = analysis.exit_summary([p.candidate for p in pairs], lm_head_cost=head_cost)
        sp = analysis.paired_speedup(pairs, rng=rng, n_resamples=1999)
        ident = analysis.token_identity(pairs)
        prefix = [analysis.common_prefix_length(p.baseline["tokens"], p.candidate["tokens"])
                  / max(1, len(p.baseline["tokens"])) for p in pairs]
        quality = {}
        for s in graded:
            sp_pairs = [p for p in pairs if p.key.suite == s]
            if sp_pairs:
                q = analysis.quality_delta(sp_pairs, margin=margin, rng=rng, n_resamples=1999, group=s)
                quality[s] = {"delta": q.statistic, "ci": [q.ci_low, q.ci_high], "baseline": q.baseline_mean,
                              "candidate": q.candidate_mean, "n": q.n, "metric": q.metric,
                              "non_inferior": bool(q.non_inferiority.pvalue <= 0.05)}
        deltas = [v["delta"] for v in quality.values()]
        out.append({**{k: v for k, v in pt.items() if k != "options"}, "options": pt["options"], "n": len(pairs),
                    "avg_layers": ex.mean_layers, "num_layers": ex.num_layers,
                    "early_exit_fraction": ex.early_exit_fraction,
                    "lm_head_evals_per_token": ex.lm_head_evals_per_token,
                    "theoretical_speedup": ex.theoretical_speedup,
                    "measured_speedup": sp.statistic, "measured_speedup_ci": [sp.ci_low, sp.ci_high],
                    "identical_outputs": ident.statistic, "prefix_agreement": float(np.mean(prefix)),
                    "quality": quality, "mean_quality_delta": float(np.mean(deltas)) if deltas else None})
    # `standard` itself (1x, no quality change) is a point of the frontier: a slower point that
    # keeps quality is dominated by simply not exiting.
    pareto = pareto_front([(p["measured_speedup"], p["mean_quality_delta"]) for p in out] + [(1.0, 0.0)])
    for i, p in enumerate(out):
        p["pareto"] = i in pareto
    return {"points": out}


def pareto_front(xy: list[tuple[float, float | None]]) -> set[int]:
    """Indices of the points no other point beats on both speed and quality (higher is better)."""
    keep = set()
    for i, (x, y) in enumerate(xy):
        if y is None:
            continue
        if not any(j != i and yj is not None and xj >= x and yj >= y and (xj > x or yj > y)
                   for j, (xj, yj) in enumerate(xy)):
            keep.add(i)
    return keep


def figure(result: dict, path: Path) -> Path:
    """Measured speedup against the mean quality delta, one colour per series, thresholds
    labelled, the Pareto points joined; beside it, theory against greedy agreement."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = result["points"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {"logit lens": "tab:red", "exit heads": "tab:blue", "calibrated": "tab:green"}
    for series, colour in colours.items():
        s = [p for p in pts if p["series"] == series]
        if not s:
            continue
        a.scatter([p["measured_speedup"] for p in s], [p["mean_quality_delta"] or 0 for p in s], c=colour,
                  label=series, zorder=3)
        b.scatter([p["theoretical_speedup"] for p in s], [p["prefix_agreement"] for p in s], c=colour,
                  label=series, zorder=3)
        for p in s:
            a.annotate(f"{p['threshold']:.3g}", (p["measured_speedup"], p["mean_quality_delta"] or 0), fontsize=7,
                       xytext=(3, 3), textcoords="offset points")
            b.annotate(f"{p['threshold']:.3g}", (p["theoretical_speedup"], p["prefix_agreement"]), fontsize=7,
                       xytext=(3, 3), textcoords="offset points")
    a.scatter([1.0], [0.0], c="black", marker="s", label="standard", zorder=3)
    front = sorted([(p["measured_speedup"], p["mean_quality_delta"]) for p in pts if p["pareto"]] + [(1.0, 0.0)])
    a.plot([x for x, _ in front], [y for _, y in front], "k--", lw=1, label="Pareto", zorder=2)
    a.axhline(0, color="grey", lw=0.5)
    a.axvline(1, color="grey", lw=0.5)
    a.set_xlabel("measured speedup vs standard")
    a.set_ylabel("quality delta (mean over graded suites)")
    a.set_title(f"{result['target']}: speed against quality")
    a.legend(fontsize=8)
    b.axvline(1, color="grey", lw=0.5)
    b.set_xlabel("theoretical speedup (LM-head checks counted)")
    b.set_ylabel("greedy tokens kept before the first divergence")
    b.set_title("theory against greedy agreement")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def table(result: dict) -> str:
    graded = result["graded_suites"]
    head = ["point", "thr", "layers", "theory", "measured [95% CI]", "identical", "prefix",
            *[f"Δ{s} [95% CI]" for s in graded], "pareto"]
    rows = [head]
    for p in result["points"]:
        q = [f"{p['quality'][s]['delta']:+.2f} [{p['quality'][s]['ci'][0]:+.2f}, {p['quality'][s]['ci'][1]:+.2f}]"
             if s in p["quality"] else "–" for s in graded]
        rows.append([p["name"], f"{p['threshold']:.3g}", f"{p['avg_layers']:.1f}/{p['num_layers']}",
                     f"{p['theoretical_speedup']:.2f}x",
                     f"{p['measured_speedup']:.2f}x [{p['measured_speedup_ci'][0]:.2f}, {p['measured_speedup_ci'][1]:.2f}]",
                     f"{p['identical_outputs']:.0%}", f"{p['prefix_agreement']:.0%}", *q, "*" if p["pareto"] else ""])
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"early-exit frontier for {result['target']} ({result['subset']} subset of {', '.join(result['suites'])}; "
             f"greedy; quality delta = candidate − standard pass rate)"]
    lines += ["  ".join(c.ljust(x) for c, x in zip(r, w)) for r in rows]
    return "\n".join(lines)


def run(args) -> int:
    from harness.run import runner
    from harness.config import ConfigError, load_config
    from harness.models import lm_head_cost_in_layers

    # Checked before the run folder exists: a NaN would reach the generated config and fail there,
    # naming a file the user never wrote and leaving the folder behind. The config's own range.
    if not 0 < args.margin <= 1:
        raise ConfigError(f"--margin must be a drop in pass rate in (0, 1], got {args.margin}")
    pts = points(args)
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    if not suites or len(set(suites)) != len(suites):  # the generated config would be refused, naming itself
        raise ConfigError(f"--suites must name one or more suites, each once, e.g. factual,code; got {args.suites!r}")
    run_dir = Path(args.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-frontier")
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "frontier.toml"
    write_config(cfg_path, args, pts, suites)
    config = load_config(cfg_path, "frontier")
    suite_objs = runner.load_suites(config)
    print(f"decodegate: run folder {run_dir}", file=sys.stderr)
    lineup = runner.Lineup(config)
    try:
        records = runner.run(config, run_dir, lineup, suite_objs, progress=not args.no_progress)
    finally:
        lineup.close()  # the workers
    graded = [s.name for s in suite_objs if any(it.grader != "none" for it in s.select(args.subset))]
    head_cost = lm_head_cost_in_layers(lineup.baseline_target.model)
    result = {"target": args.target, "subset": args.subset, "suites": suites, "graded_suites": graded,
              "margin": args.margin, **analyse(records, pts, graded, head_cost=head_cost, margin=args.margin)}
    (run_dir / "frontier.json").write_text(json.dumps(result, indent=2))
    fig = figure(result, run_dir / "figures" / "frontier.png")
    text = table(result)
    (run_dir / "frontier.txt").write_text(text + "\n")
    print(json.dumps(result, indent=2) if args.json else text)
    if not args.no_tracking:
        from harness.run import tracking
        try:
            tracking.log_frontier(result, run_dir, [fig], args.tracking_uri)
        except Exception as e:  # noqa: BLE001 - the run folder has everything
            print(f"decodegate: warning: MLflow logging failed ({e}); results are kept in {run_dir}", file=sys.stderr)
    print(f"decodegate: results in {run_dir}", file=sys.stderr)
    return 0
