"""Run untrusted Python (model output) against tests in a confined child process.

`run_code(code, tests)` starts a fresh `python -I -S -B` whose trusted preamble
(`suites/sandbox_child.py`) confines itself before it executes `code` and then `tests` in one
namespace. This module is the parent side: a fresh temporary working directory, a wall-clock
timeout that kills the whole process group, capped stdout/stderr, and the translation of what
happened into a `SandboxResult` with a short `reason`.

Layers (see sandbox_child.py for details): network + read-only mount namespaces where permitted,
all capabilities dropped, rlimits (CPU, memory, file size, files, processes), a seccomp filter
(no fork/exec/sockets/signals to others), and an audit hook that names what was refused. The audit
hook is not a security boundary against native code; the kernel layers are the backstop. What
was applied is listed in `SandboxResult.isolation`. Linux only (namespaces, seccomp, waitid).
Threads work as root (seccomp allows clone with CLONE_THREAD and the kernel exempts uid 0 from
RLIMIT_NPROC); for an unprivileged user RLIMIT_NPROC=1 refuses threads as well as processes.

Reasons: "passed", "failed" (an assertion failed), "error" (any other exception, a syntax error,
an early exit), "timeout" (wall clock), "cpu" (RLIMIT_CPU), "memory" (the address-space cap),
"file_size" (RLIMIT_FSIZE), "forbidden: <what>" (a refused operation), "killed: <signal>".
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

_CHILD_SOURCE = (Path(__file__).with_name("sandbox_child.py")).read_text(encoding="utf-8")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one run. Defaults suit one small function and its unit tests."""

    timeout_s: float = 10.0          # wall clock, from process start to the last byte of output
    cpu_s: float | None = None       # RLIMIT_CPU; None: timeout_s + 1 (the wall clock fires first)
    memory_mb: int = 512             # RLIMIT_AS of the child, after the interpreter has started
    file_size_mb: int = 16           # RLIMIT_FSIZE: the largest file the code may write
    open_files: int = 64             # RLIMIT_NOFILE
    max_output_bytes: int = 64 * 1024  # per stream; the rest is read and discarded

    def child_config(self) -> dict:
        cpu = self.cpu_s if self.cpu_s is not None else self.timeout_s + 1
        return {"cpu_s": max(1, math.ceil(cpu)), "memory_bytes": self.memory_mb << 20,
                "file_size_bytes": self.file_size_mb << 20, "open_files": self.open_files}


@dataclass(frozen=True)
class SandboxResult:
    passed: bool            # the code and the tests ran to the end without an exception
    reason: str             # see the module docstring
    detail: str             # the exception line, the refused operation, or the signal
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    truncated: bool         # stdout or stderr went past max_output_bytes
    isolation: tuple[str, ...] = field(default_factory=tuple)  # layers the child applied
    traceback: str = ""


def run_code(code: str, tests: str = "", *, limits: SandboxLimits = SandboxLimits(),
             isolate: bool = True, audit_hook: bool = True) -> SandboxResult:
    """Execute `code`, then `tests`, in a confined child; never raises for what the code does.

    `isolate=False` skips the namespaces, capability drop and seccomp (rlimits stay);
    `audit_hook=False` leaves the kernel layers alone to stop the code (used by the tests to
    show that the backstop holds). Both default to the safe setting.
    """
    tmpdir = tempfile.mkdtemp(prefix="decodegate-sandbox-")
    try:
        return _run(code, tests, limits, isolate, audit_hook, tmpdir)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _run(code, tests, limits, isolate, audit_hook, tmpdir) -> SandboxResult:
    nonce = secrets.token_hex(16)
    status_r, status_w = os.pipe()
    config = {"code": code, "tests": tests, "tmpdir": tmpdir, "nonce": nonce,
              "status_fd": status_w, "limits": limits.child_config(), "isolate": isolate,
              "audit_hook": audit_hook}
    env = {"PATH": "/usr/bin:/bin", "HOME": tmpdir, "TMPDIR": tmpdir, "LC_ALL": "C.UTF-8"}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _CHILD_SOURCE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(status_w,), cwd=tmpdir, env=env,
            start_new_session=True,  # its own process group, so a timeout can kill it all
        )
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)  # the child holds the only write end: EOF means it is gone
    try:
        try:
            proc.stdin.write(json.dumps(config).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died at start; the exit status says why
        streams, timed_out = _collect(proc, status_r, limits, start + limits.timeout_s)
    finally:
        if proc.returncode is None:  # only on an unexpected exception in the parent
            _kill_group(proc)
            proc.wait()
        os.close(status_r)
    duration = time.monotonic() - start
    return _interpret(proc.returncode, streams, nonce, timed_out, duration, limits)


def _collect(proc, status_r, limits, deadline):
    """Read stdout, stderr and the status pipe until all close or the deadline passes."""
    cap = limits.max_output_bytes
    buffers = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray()}
    caps = {"stdout": cap, "stderr": cap, "status": 1 << 20}
    dropped = {name: 0 for name in buffers}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    sel.register(status_r, selectors.EVENT_READ, "status")
    timed_out = False
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=remaining):
                fd = key.fd
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                name = key.data
                room = caps[name] - len(buffers[name])
                buffers[name] += chunk[:max(room, 0)]
                dropped[name] += max(len(chunk) - max(room, 0), 0)
    finally:
        sel.close()
    if not timed_out:
        # Every pipe is closed, but the code may have closed them itself and kept running.
        timed_out = not _wait_exit(proc, deadline)
    # Kill the group before reaping the leader: while it is unreaped its id cannot be reused,
    # so the signal cannot reach an unrelated process group.
    _kill_group(proc)
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    buffers["truncated"] = dropped["stdout"] > 0 or dropped["stderr"] > 0
    return buffers, timed_out


def _wait_exit(proc, deadline) -> bool:
    """Wait, without reaping it, for the child to exit; False if the deadline passes first."""
    while True:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _last_message(status: bytes, nonce: str, event: str) -> dict | None:
    """The last status line carrying our nonce for `event` (forged lines lack the nonce)."""
    found = None
    for line in status.decode("utf-8", "replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("nonce") == nonce and msg.get("event") == event:
            found = msg
    return found


def _interpret(returncode, streams, nonce, timed_out, duration, limits) -> SandboxResult:
    stdout = streams["stdout"].decode("utf-8", "replace")
    stderr = streams["stderr"].decode("utf-8", "replace")
    ready = _last_message(streams["status"], nonce, "ready") or {}
    done = _last_message(streams["status"], nonce, "done")
    isolation = tuple(ready.get("isolation", ()))
    tb = (done or {}).get("traceback", "")

    def result(passed, reason, detail):
        return SandboxResult(passed=passed, reason=reason, detail=detail, returncode=returncode,
                             stdout=stdout, stderr=stderr, duration_s=duration,
                             truncated=streams["truncated"], isolation=isolation, traceback=tb)

    if timed_out:
        return result(False, "timeout", f"no result within {limits.timeout_s:g} s")
    if done is not None:
        outcome, detail = done.get("outcome", "error"), done.get("detail", "")
        if outcome == "ok":
            return result(True, "passed", "")
        if outcome == "forbidden":
            return result(False, f"forbidden: {detail}", detail)
        if outcome == "memory":
            detail = f"{detail} (address-space cap {limits.memory_mb} MiB)"
        return result(False, outcome, detail)
    # No final message: the process died or exited before its preamble could report.
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and _cpu_exhausted(duration, limits)):
            return result(False, "cpu", f"CPU time limit ({limits.child_config()['cpu_s']} s)")
        if sig == signal.SIGXFSZ:
            return result(False, "file_size", f"file size limit ({limits.file_size_mb} MiB)")
        if sig == signal.SIGSYS:
            return result(False, "forbidden: system call", "killed by the seccomp filter")
        if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
            return result(False, "memory", f"address space limit ({limits.memory_mb} MiB)")
        return result(False, f"killed: {sig.name}", stderr[-2000:])
    if "MemoryError" in stderr:
        return result(False, "memory", f"address space limit ({limits.memory_mb} MiB)")
    return result(False, "error", f"exited with status {returncode} before the tests finished")


def _cpu_exhausted(duration, limits):
    return duration >= limits.child_config()["cpu_s"]


def isolation_available() -> tuple[str, ...]:
    """The layers a sandbox run gets on this machine (runs a trivial program once)."""
    return run_code("pass").isolation
