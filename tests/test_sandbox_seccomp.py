"""The sandbox's seccomp layer: an allow-list built with libseccomp, the hand-encoded deny-list
only where libseccomp is missing, and `isolation` saying which one is in force.

The probes are system calls that the deny-list lets through and that neither CPython nor the
tests need. Each one is tried from inside a completion with the audit hook off (it does not
refuse them anyway), so only the kernel's filter decides; the control runs the same code without
the sandbox and shows that the call does succeed there, so a refusal is the filter's doing.
"""

import errno
import os

import pytest

from suites.sandbox import SandboxLimits, isolation_available, parent, run_code
from suites.sandbox import filter as seccomp_filter
from suites.sandbox.denylist import DENIED, SYSCALLS
from tests.sandbox_modes import catalogue

FAST = SandboxLimits(timeout_s=10.0)
SYNC = {"x86_64": 162, "aarch64": 81}.get(os.uname().machine, -1)  # sync() returns no error

PROBES = {  # what the completion tries -> a statement that raises OSError if refused
    "sync (flushes every disk of the host)": f"check(libc.syscall({SYNC}))",
    "syncfs": "check(libc.syncfs(os.open('.', os.O_RDONLY)))",
    "sched_setaffinity": "os.sched_setaffinity(0, os.sched_getaffinity(0))",
    "setpriority": "os.setpriority(os.PRIO_PROCESS, 0, 19)",
    "flock": "fcntl.flock(os.open(os.devnull, os.O_RDONLY), fcntl.LOCK_EX)",
    "prctl(PR_SET_DUMPABLE, 1) (would undo not-dumpable)": "check(libc.prctl(4, 1, 0, 0, 0))",
    "inotify_init1": "check(libc.inotify_init1(0))",
    "personality": "check(libc.personality(0xFFFFFFFF))",
    "fsync (a flush of the host's disk)": "os.fsync(os.open(sys.executable, os.O_RDONLY))",
    "fdatasync": "os.fdatasync(os.open(sys.executable, os.O_RDONLY))",
    "sync_file_range": "check(libc.sync_file_range(os.open(sys.executable, os.O_RDONLY), 0, 0, 7))",
    "msync(MS_SYNC)": ("libc.mmap.restype = ctypes.c_void_p; check(libc.msync(ctypes.c_void_p(libc.mmap("
                       "None, 4096, 1, 1, os.open(sys.executable, os.O_RDONLY), 0)), 4096, 4))"),
    "ioctl(FIOQSIZE)": ("check(libc.ioctl(os.open('q', os.O_CREAT | os.O_RDWR), 0x5460, "
                        "ctypes.byref(ctypes.c_longlong())))"),
}
PROBE_CODE = """
import ctypes, fcntl, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(ret):
    if ret < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
def probe():
    try:
        {statement}
    except OSError as e:
        return e.errno
    return 0
"""


@pytest.fixture(scope="module")
def layers():
    return isolation_available()


def _seccomp_layer(layers):
    return next((x for x in layers if x.startswith(("seccomp", "no-seccomp"))), None)


def test_the_allow_list_is_in_force_where_libseccomp_is(layers):
    layer = _seccomp_layer(layers)
    assert layer is not None, layers
    if parent._seccomp_binding()[0] is None:
        pytest.skip(f"libseccomp is missing here: {parent._seccomp_binding()[2]}")
    assert layer.startswith("seccomp (allow-list, libseccomp 2."), layers


@pytest.mark.parametrize("probe", catalogue(PROBES, fast=["sync (flushes every disk of the host)",
                                                   "fsync (a flush of the host's disk)"]))
def test_a_syscall_outside_the_allow_list_is_refused(probe, layers):
    if not _seccomp_layer(layers).startswith("seccomp (allow-list"):
        pytest.skip(f"no allow-list here: {layers}")
    code = PROBE_CODE.format(statement=PROBES[probe])
    # Outside the sandbox the call succeeds: a refusal inside is the filter's, not the kernel's.
    control = run_code(code, "assert probe() == 0, probe()\n", limits=FAST, isolate=False,
                       audit_hook=False)
    assert control.passed, control
    r = run_code(code, f"assert probe() == {errno.EPERM}, probe()\n", limits=FAST, audit_hook=False)
    assert r.passed, r


def test_what_python_and_the_tests_need_still_runs(layers):
    """A completion that uses threads, files, pipes, select, time, randomness and signals to
    itself passes under the allow-list (CPython's own needs are what the list was built from).
    Without the filesystem view nothing can be created (there is no capped tmpfs) and chmod
    and utime are refused (Landlock does not cover them), so files are tried only inside the
    view."""
    view = any(x.startswith("minimal-root") for x in layers)
    # Where nothing counts threads (no uid of its own, no pids cgroup) clone is refused.
    threads = not any(x.startswith("seccomp (") and "no threads" in x for x in layers)
    code = ("import threading, os, select, time, random, tempfile, signal, shutil, queue, fcntl\n"
            "q = queue.Queue()\n"
            "ts = [threading.Thread(target=lambda: q.put(sum(range(10000)))) for _ in range(4)]\n"
            + ("[t.start() for t in ts]; [t.join() for t in ts]\n" if threads else
               "[q.put(sum(range(10000))) for t in ts]\n")
            + ("with tempfile.TemporaryDirectory() as d:\n"
               "    p = os.path.join(d, 'x'); open(p, 'w').write('hi'); shutil.copy2(p, p + '.bak')\n"
               "    os.rename(p, p + '.y'); os.set_blocking(os.open(p + '.y', os.O_RDONLY), False)\n"
               "    assert sorted(os.listdir(d)) == ['x.bak', 'x.y']\n" if view else "") +
            "r, w = os.pipe(); os.write(w, b'x'); assert select.select([r], [], [], 1)[0] == [r]\n"
            "fcntl.fcntl(r, fcntl.F_SETFL, os.O_NONBLOCK)\n"
            "got = []\nsignal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
            "signal.raise_signal(signal.SIGUSR1); os.kill(os.getpid(), signal.SIGUSR1)\n"
            "time.sleep(0.01); random.random(); os.urandom(8); os.cpu_count()\n"
            "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))\n"
            "def total():\n    return q.qsize(), len(got)\n")
    r = run_code(code, "assert total() == (4, 2), total()\n", limits=FAST, audit_hook=False)
    assert r.passed, r


def test_the_deny_list_is_the_fallback_where_libseccomp_is_missing(monkeypatch, layers):
    if not any(x.startswith("seccomp (") for x in layers):
        pytest.skip(f"no seccomp at all here: {layers}")
    monkeypatch.setattr(parent, "_seccomp_binding", lambda: (None, {}, "libseccomp not found"))
    code = PROBE_CODE.format(statement=PROBES["flock"])
    r = run_code(code, "assert probe() == 0, probe()\n", limits=FAST, audit_hook=False)
    assert r.passed, r  # the deny-list lets this one through: the fallback is weaker, and says so
    # (with "; no threads" where nothing counts threads)
    assert any(x.startswith("seccomp (deny-list, hand-encoded BPF: libseccomp not found") for x in r.isolation), \
        r.isolation
    # F_SETPIPE_SZ: a grown pipe's buffer is memory the memory watch cannot see.
    for code in ("import os\nos.fork()\n", "import socket\nsocket.socket()\n",
                 "import fcntl, os\nfcntl.fcntl(os.pipe()[1], 1031, 1 << 20)\n"):
        r = run_code(code, "", limits=FAST, audit_hook=False)
        assert not r.passed and r.reason.startswith("forbidden: PermissionError"), r


def test_the_allow_list_is_narrow_and_disjoint_from_the_deny_list():
    if parent._seccomp_binding()[0] is None:
        pytest.skip(f"libseccomp is missing here: {parent._seccomp_binding()[2]}")
    import pyseccomp
    allowed = seccomp_filter.allowed_names()
    assert len(allowed) == len(set(allowed)) and len(allowed) < 150, len(allowed)
    assert not set(allowed) & set(DENIED), set(allowed) & set(DENIED)
    # Allowed only with a condition on their arguments, never as a whole:
    assert not {"clone", "kill", "tgkill", "prlimit64", "fcntl", "ioctl", "prctl", "msync"} & set(allowed)
    assert not {"fsync", "fdatasync", "sync_file_range", "sync", "syncfs"} & set(allowed)
    assert {n for n, *_ in seccomp_filter.CONDITIONAL} == {"clone", "clone3", "kill", "tgkill",
                                                         "prlimit64", "fcntl", "ioctl", "prctl", "msync"}
    for name in allowed + [n for n, *_ in seccomp_filter.CONDITIONAL]:  # no typo in a name
        assert pyseccomp.resolve_syscall(pyseccomp.Arch.X86_64, name) != -1, name
    assert set(SYSCALLS) == {"x86_64", "aarch64"}
    # Without the filesystem view, chmod and utime are left out (Landlock does not cover them).
    assert {"chmod", "fchmod", "utimensat"} & set(allowed) - set(seccomp_filter.allowed_names(view=False)) \
        == {"chmod", "fchmod", "utimensat"}
