"""Upload a finished run folder to MLflow, e.g. after the tracking server was down during the
run. Idempotent: runs already uploaded (matched by the run's id tag) are not created again.
Exit codes: 0 uploaded, 2 not a run folder or the server cannot be reached."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run folder written by `decodegate regress`")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")


def run(args) -> int:
    from harness.run import tracking
    from harness.run.records import read_records, read_summary
    run_dir = Path(args.run_dir)
    read_summary(run_dir)  # a broken folder is named before any upload starts
    read_records(run_dir)
    try:
        ids = tracking.log_run(run_dir, args.tracking_uri)
    except tracking.TrackingUnavailable as e:
        print(f"decodegate: error: {e}", file=sys.stderr)
        return 2
    print(f"decodegate: synced {run_dir} to {tracking.resolve_uri(args.tracking_uri)}: "
          f"{len(ids) - 1} candidate run(s) under parent {ids['parent']}")
    return 0
