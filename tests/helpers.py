"""Plain functions the tests share: a regress config written from parts, the shipped config's
values, records as the runner writes them, a real MLflow server, and running `regress`.

Fixtures built on these live in conftest.py; anything here is an ordinary function a test calls.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = tomllib.loads((ROOT / "regress.toml").read_text())


def toml_lines(table: dict) -> str:
    """`key = value` lines; JSON's scalars and flat arrays are TOML too."""
    return "\n".join(f"{k} = {json.dumps(v)}" for k, v in table.items())


def _key(name: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise (`"lmeval:task"`)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def shipped_smoke(*keys: str) -> dict:
    """The shipped smoke profile's values for `keys` (a KeyError names a key it lost)."""
    return {k: SHIPPED["profiles"]["smoke"][k] for k in keys}


def write_regress_config(path: Path, *, profile: dict, candidates: str = "", suites: dict | str = "",
                         target: str = "tiny-llama", head: dict | str = "", gates: dict | str | None = None,
                         tail: str = "", profile_name: str = "smoke") -> Path:
    """A regress.toml with the standard baseline: `candidates` and `tail` are TOML text, `suites`
    a dict of suite name -> options (or TOML text), `head` top-level keys after the target (a
    dict, or TOML text)."""
    if isinstance(suites, dict):
        suites = "\n".join(f"[suites.{_key(name)}]\n{toml_lines(opts)}".rstrip() for name, opts in suites.items())
    parts = [f"target = {json.dumps(str(target))}", head if isinstance(head, str) else toml_lines(head),
             '[baseline]\nname = "baseline"\ndecoder = "standard"', candidates.strip(), suites,
             f"[profiles.{profile_name}]", toml_lines(profile)]
    if gates is not None:
        parts += ["[gates]", gates if isinstance(gates, str) else toml_lines(gates)]
    parts.append(tail)
    path.write_text("\n".join(p for p in parts if p) + "\n")
    return path


def spec_candidate(options: str = '{ draft = "prompt-lookup", k = 3 }', name: str = "spec") -> str:
    """TOML text of one speculative candidate (prompt lookup, K = 3 unless `options` say otherwise)."""
    return f'[[candidates]]\nname = "{name}"\ndecoder = "speculative"\noptions = {options}\n'


def regress(cfg: Path, run_dir: Path, *extra: str) -> int:
    """`decodegate regress` in process, without tracking or progress; its exit code."""
    from harness.cli import main
    return main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", "--no-tracking",
                 *extra])


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def record(suite, candidate: str, item_id: str, **fields) -> dict:
    """One records.jsonl row of `suite` as the runner writes it: `harness.calibration.synthetic.
    make_record`'s keywords go to it (greedy, seed 0 by default), any other field overrides the row."""
    from harness.calibration.synthetic import make_record
    known = {k: fields.pop(k) for k in list(fields) if k in _MAKE_RECORD_KEYS}
    row = make_record(candidate=candidate, suite=suite.name, suite_hash=suite.hash, suite_version=suite.version,
                      item_id=item_id, **known)
    row.update(fields)
    return row


_MAKE_RECORD_KEYS = {"decoder", "categories", "seed", "temperature", "tokens", "margins", "score", "passed", "stats",
                     "ttft_s", "step_s", "wall_s"}


def errored_record(suite, candidate: str, item_id: str, error: str, **fields) -> dict:
    """A failed generation as the runner records it (make_row with a DecoderError): no tokens, no
    text, score 0, no timing unless given, the error."""
    fields = {"timing": {}, **fields}
    return record(suite, candidate, item_id, tokens=(), margins=(), error=error, text="", score=0.0, passed=False,
                  **fields)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(folder: Path, port: int | None = None, start_timeout: float = 120):
    """A real `mlflow server` on sqlite in `folder` (DESIGN.md: healthy in ~7 s); yields its URI
    once it answers, and stops it (its whole process group) however the block ends."""
    from harness.run.tracking import TrackingUnavailable, check_health
    port = port or free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
         f"sqlite:///{folder}/mlflow.db", "--artifacts-destination", str(folder / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + start_timeout
        while True:
            try:
                check_health(uri, timeout=1)
                break
            except TrackingUnavailable:
                assert server.poll() is None and time.time() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
