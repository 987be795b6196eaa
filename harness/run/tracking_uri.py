"""Where the MLflow store is, and whether it answers: shared by the tracking module and the
baseline store (`mlflow:RUN_ID`), without importing mlflow.

MLflow's own client retries for minutes per call against a server that is down, so health is
checked first with a short timeout.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request

DEFAULT_URI = "sqlite:///mlflow.db"


class TrackingUnavailable(ValueError):
    """The tracking server could not be reached; the run folder still holds everything. A
    ValueError, as every error of the user's input or environment is here: one line, exit 2."""


def resolve_uri(uri: str | None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def check_health(uri: str, timeout: float = 3.0) -> None:
    """Raise TrackingUnavailable unless a remote server answers /health within `timeout`."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:
            if r.status != 200:
                raise TrackingUnavailable(f"{uri} answered {r.status} on /health")
    except (urllib.error.URLError, OSError) as e:
        raise TrackingUnavailable(f"tracking server {uri} is not reachable ({getattr(e, 'reason', e)})") from e
