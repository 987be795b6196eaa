"""Where the MLflow store is, and whether it answers: shared by the tracking module and the
baseline store (`mlflow:RUN_ID`), without importing mlflow.

MLflow's own client retries for minutes per call against a server that is down, so health is
checked first with a short timeout.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_URI = "sqlite:///mlflow.db"


class TrackingUnavailable(ValueError):
    """The tracking server could not be reached; the run folder still holds everything. A
    ValueError, as every error of the user's input or environment is here: one line, exit 2."""


def resolve_uri(uri: str | None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def check_health(uri: str, timeout: float = 3.0) -> None:
    """Raise TrackingUnavailable unless a remote server answers /health within `timeout`, or a
    `sqlite:///PATH` store is a file SQLite could open."""
    if uri.startswith("sqlite:///"):
        _check_sqlite(uri)
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:
            if r.status != 200:
                raise TrackingUnavailable(f"{uri} answered {r.status} on /health")
    except (urllib.error.URLError, OSError) as e:
        raise TrackingUnavailable(f"tracking server {uri} is not reachable ({getattr(e, 'reason', e)})") from e


def _check_sqlite(uri: str) -> None:
    # A folder or a file of another kind: MLflow retries it for about two minutes and then fails
    # with a database traceback; said here in one line instead. A missing file is a new store.
    path = Path(uri[len("sqlite:///"):])
    if path.is_dir():
        raise TrackingUnavailable(f"tracking URI {uri}: {path} is a folder, not an SQLite file (e.g. "
                                  f"sqlite:///{path / 'mlflow.db'})")
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            raise TrackingUnavailable(f"tracking URI {uri}: {path} is not an SQLite database")
