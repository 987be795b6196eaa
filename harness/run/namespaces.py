"""The decoder's own process tree inside its worker (harness.run.worker): two processes down
from the one decodegate started, in a PID namespace of its own and a mount namespace where the
run folder and the code decodegate imports are read-only and /proc is the namespace's own, where
the kernel gives them, and with no capability. A decoder can then neither name decodegate (to
kill or stop it) nor rewrite the ledger its verdict is judged from or the code it runs; the
process decodegate started ends as the decoder's ended, so a death reads the same with or without
them."""
from __future__ import annotations

import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522  # capset(2)'s header: two 32-bit words of each set


def behind(conn, protect: tuple) -> None:
    """Go on two processes down, in a PID namespace of its own where the kernel gives one: the
    decoder can then name no process outside its worker (os.getppid() is the namespace's pid 1,
    which no signal from inside reaches), so it cannot kill or stop decodegate. This process
    stays the worker the parent sees and ends as the decoder's process ends (exit status or
    signal); pid 1 reaps. Without a namespace (no privilege) the decoder's parent is still this
    process, never decodegate. The folders in `protect` (the run folder) are read-only there,
    in a mount namespace of its own, and so is the code decodegate imports (code_folders)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    spaced = libc.unshare(CLONE_NEWPID | (CLONE_NEWNS if protect else 0)) == 0
    mounts = spaced and bool(protect)  # a mount namespace of the worker's own, private to it
    if mounts and not _read_only(libc, (*protect, *code_folders())):
        mounts = False
        print(f"decodegate worker: the run folder stays writable here ({os.strerror(ctypes.get_errno())})",
              file=sys.stderr)
    elif not spaced and protect:
        spaced = libc.unshare(CLONE_NEWPID) == 0
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid:
        conn.close()
        os.close(status_w)
        _end_as(pid, status_r)
    os.close(status_r)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: its parent's end is its end
    if spaced:  # pid 1 of the namespace: reap, and pass the decoder's end up
        if mounts:
            _own_proc(libc)
        pid = os.fork()
        if pid:
            conn.close()
            _reap(pid, status_w)
        libc.prctl(1, signal.SIGKILL)
    os.close(status_w)
    _powerless(libc)


def _own_proc(libc) -> None:
    """/proc of the namespace's own (in its private mount namespace): the host's /proc would show
    every process outside it, and /proc/<pid>/root of one is the run folder, writable."""
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        print("decodegate worker: the host's /proc stays visible here", file=sys.stderr)


def _powerless(libc) -> None:
    """The decoder holds no capability, and cannot regain one (no_new_privs, an empty bounding
    set, so an exec of anything, setuid or not, gives none): as root it could otherwise unmount or
    remount the read-only run folder, or reach decodegate's files and memory through /proc."""
    import ctypes
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):  # past the kernel's last capability prctl says EINVAL: harmless
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: none, in both 32-bit words
    if libc.capset(header, data) != 0:
        print(f"decodegate worker: the decoder keeps its capabilities ({os.strerror(ctypes.get_errno())})",
              file=sys.stderr)


def code_folders() -> list[str]:
    """Where decodegate's process imports from, later in the run (lm-eval, the verdict's modules
    are imported when first used): decodegate's own folder, the site-packages and the standard
    library. A module the decoder wrote there would run in decodegate."""
    import sysconfig
    import harness
    paths = sysconfig.get_paths()
    found = [os.path.dirname(os.path.dirname(os.path.abspath(harness.__file__)))]
    found += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    real = [os.path.realpath(p) for p in found]
    return [p for i, p in enumerate(real) if os.path.isdir(p) and p not in real[:i]]


def _read_only(libc, paths: tuple) -> bool:
    """Mount each path read-only over itself, seen by this mount namespace only. A decoder that
    writes there (its own ledger of deaths, a record) gets EROFS. True when done: the caller may
    go on; False at the first refusal (the paths before it stay read-only, in this namespace only)."""
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing leaks to the host's mounts
        return False
    for path in (os.fsencode(str(p)) for p in paths):
        if libc.mount(path, path, None, MS_BIND | MS_REC, None) != 0 or \
                libc.mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
            return False
    return True


def _quiet() -> None:
    """A process that only waits: no stack dump of its own in the decoder's stderr."""
    import faulthandler
    faulthandler.unregister(signal.SIGUSR1)
    faulthandler.disable()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the parent signals the group for the decoder's stack


def _reap(pid: int, status_w: int) -> None:
    """Pid 1: wait for every process of the namespace until the decoder's own ends, then write
    its wait status up (a signal sent by pid 1 to itself would be ignored) and end the namespace."""
    _quiet()
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            os.write(status_w, status.to_bytes(4, "little"))
            os._exit(0)


def _end_as(pid: int, status_r: int) -> None:
    """The worker the parent sees: end as the decoder's process ended."""
    _quiet()
    _, status = os.waitpid(pid, 0)
    passed = os.read(status_r, 4)
    if len(passed) == 4:  # pid 1's report of the decoder's end (pid 1 itself exited 0)
        status = int.from_bytes(passed, "little")
    if os.WIFSIGNALED(status):
        import resource
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two no handler can be set for (EINVAL)
            signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no 2nd core
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
