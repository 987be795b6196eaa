"""The baseline store: baseline generations kept by content, reused by later runs.

A row's key is a hash of everything the generation depends on (`key_parts`): the target's
fingerprint (weights and tokenizer, harness.run.fingerprint), the decoder, its options and source,
the request (prompt ids, sampling, seed, budget, stops), the device, its processor (model, and for
a CPU vendor, family and vector extensions) and dtype, and torch and transformers versions, or for
an engine its build, launch flags and environment, this machine's processors, the files its command
names (by full path and content) and the client code that builds its requests (harness.run.reuse
refuses engines given only by a URL unless the config opts in). Equal key, equal output (for a
deterministic baseline), so a regress run takes the rows it finds and generates the rest. A changed
fingerprint matches nothing: nothing is reused.

The store is a folder (default `<user cache>/decodegate/baselines`), one JSON file per row,
written to a temporary name and renamed into place: two runs writing at once never tear a row,
and a reader never sees half of one. A row that does not parse, or whose content does not hash
to its name, is skipped with a warning naming it. `mlflow:<run id>` reads the rows a logged run
uploaded (artifact `baseline_store/`), read-only.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from harness.run.records import _finite as finite


class StoreError(ValueError):
    """A store location that cannot be used as given."""


def default_root() -> Path:
    """$DECODEGATE_BASELINE_STORE, else <user cache>/decodegate/baselines."""
    if os.environ.get("DECODEGATE_BASELINE_STORE"):
        return Path(os.environ["DECODEGATE_BASELINE_STORE"])
    from harness.models import cache_dir
    return cache_dir() / "baselines"


def key_of(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _warn(msg: str) -> None:
    print(f"decodegate: warning: baseline store: {msg}", file=sys.stderr)


class BaselineStore:
    def __init__(self, root: Path | str, *, writable: bool = True, label: str | None = None):
        self.root = Path(root).expanduser()
        self.label = label or str(self.root)
        self.writable = writable
        self.skipped: list[str] = []      # rows that could not be read, with why
        self.readable = True
        if self.root.exists() and not self.root.is_dir():
            self.readable = self.writable = False
            _warn(f"{self.root} is not a folder: nothing is reused or stored; baseline rows are generated")
        elif self.root.exists() and not os.access(self.root, os.R_OK | os.X_OK):
            self.readable = False
            _warn(f"{self.root} is not readable: nothing is reused; baseline rows are generated")

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if not self.readable:
            return None
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._skip(path, f"unreadable ({e.strerror or e})")
            return None
        try:
            row = json.loads(data)
            ok = isinstance(row, dict) and key_of(row["key_parts"]) == key and isinstance(row.get("result"), dict)
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            self._skip(path, "corrupt (not a whole row for this key)")
            return None
        return row

    def _skip(self, path: Path, why: str) -> None:
        self.skipped.append(f"{path}: {why}")
        _warn(f"row {path} skipped: {why}; the baseline is generated for it")

    def put(self, key: str, parts: dict, result: dict, source: dict) -> bool:
        """Write one row atomically; False (with a warning) where the store cannot take it.

        The row is serialized as the run records are (harness.run.records: NaN and infinities
        become null), before any file is opened; a write that fails removes its temporary file.
        A folder that cannot be written is given up for the run (warned once); a row that cannot
        be serialized is skipped alone."""
        if not self.writable:
            return False
        path = self._path(key)
        row = {"key": key, "key_parts": parts, "result": result, "source": source,
               "stored": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            body = json.dumps(finite(row), allow_nan=False)
        except (TypeError, ValueError) as e:
            _warn(f"row {path} not stored: it cannot be written as JSON ({e})")
            return False
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return True
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.writable = False
            _warn(f"cannot write row {path} ({e.strerror or e}); this run's further baseline rows are not "
                  f"stored in {self.label}")
            return False


def open_store(spec: str | None, fresh: bool, tracking_uri: str | None = None) -> BaselineStore | None:
    """`--baseline-store`: a folder, `mlflow:<run id>` (read-only), or `none`; default: the user
    cache. `--fresh-baseline` still writes what it generates, but reads nothing."""
    if spec == "none":
        return None
    if spec and spec.startswith("mlflow:"):
        if fresh:
            raise StoreError("--fresh-baseline with an mlflow: store reads nothing and cannot write: drop one")
        return _from_mlflow(spec[len("mlflow:"):], tracking_uri)
    store = BaselineStore(spec or default_root())
    if fresh:
        store.readable = False
    return store


ARTIFACT = "baseline_store"


def _from_mlflow(run_id: str, tracking_uri: str | None) -> BaselineStore:
    import tempfile
    from harness.run.tracking_uri import TrackingUnavailable, check_health, resolve_uri
    import mlflow
    if not run_id:
        raise StoreError("mlflow: needs a run id, e.g. --baseline-store mlflow:0123abcd...")
    uri = resolve_uri(tracking_uri)
    try:
        check_health(uri)  # a server that is down: said in seconds, not after MLflow's retries
    except TrackingUnavailable as e:
        raise StoreError(f"baseline store mlflow:{run_id}: {e}") from None
    dest = Path(tempfile.mkdtemp(prefix="decodegate-store-"))
    try:
        mlflow.set_tracking_uri(uri)
        path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=ARTIFACT, dst_path=str(dest))
    except Exception as e:  # noqa: BLE001 - any MLflow failure means: this store cannot be read
        raise StoreError(f"baseline store mlflow:{run_id}: cannot download artifact {ARTIFACT}/ ({e})") from None
    return BaselineStore(path, writable=False, label=f"mlflow:{run_id}")
