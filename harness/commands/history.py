"""Trends across regress runs: per candidate and category, α, τ, speedup, identity and verdict over
the last N runs logged to MLflow, as a table and a figure. A run whose target or baseline had other
content fingerprints than the newest run of that candidate (a new tokenizer, a fine-tune under the
same name) is marked with `*`: its numbers are about another model. Exit codes: 0 shown, 2 the
tracking server cannot be reached.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--last", type=int, default=10, help="how many regress runs, newest first (default: %(default)s)")
    p.add_argument("--candidate", action="append", default=[], help="only this candidate (repeatable)")
    p.add_argument("--category", action="append", default=[],
                   help="only this category (repeatable; ALL is every prompt of the candidate)")
    p.add_argument("--figure", default="history.png", help="where to draw the figure ('none': no figure; "
                                                           "default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def _f(x, spec=".3f") -> str:
    return "–" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    head = ("run", "candidate", "category", "n", "α", "τ", "speedup", "identity", "verdict", "target")
    lines = [head]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["start_time"] / 1000)) if r.get("start_time") else "?"
        fp = (r.get("target_fingerprint") or "?")[:8] + (" *" if r["other_target"] else "")
        lines.append((f"{when} {r['run_id'][:8]}", r["candidate"], r["category"], _f(r.get("n"), ".0f"),
                      _f(r.get("alpha")), _f(r.get("tau"), ".2f"), _f(r.get("speedup"), ".2f") + "x"
                      if r.get("speedup") is not None else "–", _f(r.get("identity")), r.get("verdict") or "?", fp))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    if any(r["other_target"] for r in rows):
        out.append("\n* another target fingerprint than the newest run of this candidate: re-checked model, "
                   "not a trend of the same one")
    return "\n".join(out)


def figure(rows: list[dict], path: str) -> None:
    """One panel per quantity; a line per candidate and category, oldest run on the left; points of
    another target fingerprint drawn hollow in red."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = sorted({(r["start_time"] or 0, r["run_id"]) for r in rows})
    x_of = {rid: i for i, (_, rid) in enumerate(runs)}
    panels = [("alpha", "α (acceptance)"), ("tau", "τ (tokens per target forward)"), ("speedup", "speedup"),
              ("identity", "identity rate")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels)), sharex=True)
    for ax, (q, label) in zip(axes, panels):
        series: dict = {}
        for r in rows:
            if r.get(q) is not None:
                series.setdefault(f"{r['candidate']} / {r['category']}", []).append(r)
        for name, rs in sorted(series.items()):
            rs = sorted(rs, key=lambda r: x_of[r["run_id"]])
            line, = ax.plot([x_of[r["run_id"]] for r in rs], [r[q] for r in rs], marker="o", label=name)
            other = [r for r in rs if r["other_target"]]
            if other:
                ax.scatter([x_of[r["run_id"]] for r in other], [r[q] for r in other], s=90, facecolors="none",
                           edgecolors="red", zorder=3)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7, loc="best")
    axes[-1].set_xticks(range(len(runs)))
    axes[-1].set_xticklabels([time.strftime("%m-%d %H:%M", time.gmtime(t / 1000)) + f"\n{rid[:6]}"
                              for t, rid in runs], fontsize=7)
    axes[0].set_title("decodegate history (red ring: another target fingerprint)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def nothing_shown(found: list[dict], args) -> str:
    """Why the table is empty: no runs at all, or runs that the filters left out (a misspelt
    candidate or category must not read as "nothing was logged")."""
    from harness.run import tracking
    where = f"experiment {tracking.EXPERIMENT!r} at {tracking.resolve_uri(args.tracking_uri)}"
    if not found:
        return f"no regress runs in {where}"
    asked = [f"--candidate {c}" for c in args.candidate] + [f"--category {c}" for c in args.category]
    names = lambda key: ", ".join(sorted({r[key] for r in found}))  # noqa: E731
    return (f"nothing matches {' '.join(asked)} in the last {args.last} regress run(s) of {where}; "
            f"candidates there: {names('candidate')}; categories: {names('category')}")


def run(args) -> int:
    from harness.run import tracking
    from harness.run.tracking_history import history
    if args.last < 1:
        from harness.config import ConfigError
        raise ConfigError(f"--last must be >= 1, got {args.last}")
    try:
        found = history(args.tracking_uri, tracking.EXPERIMENT, args.last)
    except tracking.TrackingUnavailable as e:
        print(f"decodegate: error: {e}", file=sys.stderr)
        return 2
    rows = [r for r in found if (not args.candidate or r["candidate"] in args.candidate)
            and (not args.category or r["category"] in args.category)]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        print(table(rows))
    else:
        print(nothing_shown(found, args))
    if rows and args.figure != "none":
        figure(rows, args.figure)
        print(f"decodegate: figure in {args.figure}", file=sys.stderr)
    return 0
