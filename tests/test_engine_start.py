"""Engines that do not depend on each other start at once (harness.run.engines.started): the
second engine's process is launched before the first one is waited for.

Each engine is scripts/fake_engine.py behind a shell line. Engine `a` becomes healthy only once
engine `b`'s process has started (it waits for the file `b` writes as it launches), so a start
one after another never sees `a` healthy and fails on its health timeout; a start at once passes.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from decoders.engines.server import EngineError, EngineSpec
from harness.run.engines import started

FAKE = Path(__file__).resolve().parents[1] / "scripts" / "fake_engine.py"


def _config(tmp_path: Path, health_timeout_s: float) -> SimpleNamespace:
    marker = tmp_path / "b-launched"
    serve = f"exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}}"
    a = f"while [ ! -e {shlex.quote(str(marker))} ]; do sleep 0.1; done; {serve}"
    b = f"touch {shlex.quote(str(marker))}; {serve}"
    engines = {n: EngineSpec(name=n, launch=("sh", "-c", cmd), model="smollm2-135m", health_timeout_s=health_timeout_s)
               for n, cmd in (("a", a), ("b", b))}
    decoder = lambda engine: SimpleNamespace(options={"engine": engine})  # noqa: E731
    return SimpleNamespace(engines=engines, baseline=decoder("a"), candidates=[decoder("b")])


def test_engines_that_do_not_depend_on_each_other_start_at_once(tmp_path):
    with started(_config(tmp_path, 60.0), tmp_path) as servers:
        assert sorted(servers) == ["a", "b"]
        assert all(s.info["models"] == ["smollm2-135m"] and s.alive() for s in servers.values())
        procs = [s.proc for s in servers.values()]
    assert all(p.poll() is not None for p in procs)  # both stopped on the way out


def test_an_engine_that_never_becomes_healthy_is_named_and_every_started_one_stopped(tmp_path):
    """`b` exits at once without writing `a`'s marker, so `a` never becomes healthy: the error names
    `a`, the caller's clean-up runs, and no launched process is left behind."""
    config = _config(tmp_path, 3.0)
    config.engines["b"] = EngineSpec(name="b", launch=("sh", "-c", "exit 7"), model="smollm2-135m", health_timeout_s=3.0)
    called = []
    with pytest.raises(EngineError, match="engine 'a'") as e:
        with started(config, tmp_path, on_failed_start=lambda: called.append(1)):
            pass
    assert called and "not healthy" in str(e.value)
    marker = str(tmp_path / "b-launched")
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and marker in _cmdline(p)]
    assert not left, left


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
