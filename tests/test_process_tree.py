"""The decoder's process tree in its worker (harness.run.namespaces), alone: however the decoder
ends, the process decodegate started ends the same way (exit status or signal), with a PID
namespace and without one (an unprivileged worker, where unshare is refused), and what the
decoder forked does not keep it up. Each case forks a worker-to-be from this test process; no
model is loaded."""
from __future__ import annotations

import os
import signal
import time

import pytest

from harness.run.namespaces import behind

ENDS = {  # how the decoder ends -> the wait status the worker must end with (exit code as Python gives it)
    "exit-0": 0, "exit-1": 1, "exit-255": 255, "SIGSEGV": -signal.SIGSEGV, "SIGKILL": -signal.SIGKILL,
    "SIGABRT": -signal.SIGABRT, "SIGTERM": -signal.SIGTERM, "SIGUSR1": -signal.SIGUSR1,
    "orphan-then-exit-3": 3, "kill-pid-1-then-exit-4": 4,
}


class _Conn:
    def close(self):
        pass


def _decoder(end: str) -> None:
    """What the decoder does, two processes down."""
    if end.startswith("exit-"):
        os._exit(int(end[5:]))
    if end.startswith("SIG"):
        os.kill(os.getpid(), getattr(signal, end))
        time.sleep(5)
    if end == "orphan-then-exit-3":  # a child that outlives the decoder, holding what it inherited
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        os._exit(3)
    if end == "kill-pid-1-then-exit-4":  # the namespace's pid 1 (without one: its parent, the worker's own)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(0.5)
        os._exit(4)
    os._exit(99)


def _worker(end: str, unprivileged: bool) -> int:
    """A worker-to-be that goes `behind` and whose decoder ends as `end`: its exit code."""
    pid = os.fork()
    if pid == 0:
        try:
            import resource
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.setpgid(0, 0)
            if unprivileged:  # no capability: unshare(CLONE_NEWPID) is refused, as for a user's worker
                os.setgid(65534)
                os.setuid(65534)
            behind(_Conn(), ())
            _decoder(end)
        finally:
            os._exit(98)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the worker did not end within 30 s of its decoder's {end}")


@pytest.mark.parametrize("unprivileged", [False, True], ids=["namespaces", "unprivileged"])
@pytest.mark.parametrize("end", list(ENDS))
def test_the_worker_ends_as_its_decoder_ended(end, unprivileged):
    if os.geteuid() != 0 and not unprivileged:
        pytest.skip("no PID namespace for a user here")
    if end == "kill-pid-1-then-exit-4" and unprivileged:
        # Without a namespace the decoder's parent is the worker itself: it can end it (read as
        # killed by SIGKILL, a death all the same), never decodegate.
        assert _worker(end, unprivileged) == -signal.SIGKILL
        return
    assert _worker(end, unprivileged) == ENDS[end]
