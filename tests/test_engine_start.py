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


@pytest.mark.full
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


CHILD = """
import json, shlex, sys, time
from pathlib import Path
from types import SimpleNamespace
from decoders.engines.server import EngineSpec
from harness.run.engines import started
tmp, fake = Path(sys.argv[1]), sys.argv[2]
serve = f"exec {shlex.quote(sys.executable)} {shlex.quote(fake)} --port {{port}}"
cmds = {"a": "trap '' TERM; " + serve, "b": serve}  # a ignores SIGTERM (an engine stuck in its shutdown)
engines = {n: EngineSpec(name=n, launch=("sh", "-c", c), model="smollm2-135m", health_timeout_s=120.0)
           for n, c in cmds.items()}
config = SimpleNamespace(engines=engines, baseline=SimpleNamespace(options={"engine": "a"}),
                         candidates=[SimpleNamespace(options={"engine": "b"})])
with started(config, tmp) as servers:
    (tmp / "pids.tmp").write_text(json.dumps({n: s.proc.pid for n, s in servers.items()}))
    (tmp / "pids.tmp").rename(tmp / "pids")
    time.sleep(600)
"""


@pytest.mark.full
def test_a_second_sigterm_while_engines_stop_leaves_none_running(tmp_path):
    """SIGTERM stops the run; a second one (a user's second Ctrl-C) comes while the first engine,
    which ignores SIGTERM, is waited for. Before, the stop loop ended there: the second engine was
    never signalled and the first was never killed, and the parent-death signal (SIGTERM) left it
    running after decodegate had exited. Now every engine gets SIGTERM first, and a second signal
    kills what is still running."""
    import json
    import os
    import signal
    import subprocess
    import time
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(FAKE)], env=env)
    pids = {}
    try:
        for _ in range(1200):  # until both engines answer (the child writes their pids)
            if (tmp_path / "pids").exists() or child.poll() is not None:
                break
            time.sleep(0.1)
        assert child.poll() is None, "the engines did not start"
        pids = json.loads((tmp_path / "pids").read_text())
        child.send_signal(signal.SIGTERM)
        time.sleep(2)  # the stop is under way: engine a is waited for (up to 15 s), b is next
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
        time.sleep(1)  # the kernel's parent-death signal to what is left
        left = [n for n, pid in pids.items() if _running(pid)]
        assert not left, f"engines left running after decodegate exited: {left}"
    finally:
        if child.poll() is None:
            child.kill()
        for pid in pids.values():  # only the engines this test started
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
