"""The seccomp filter of a sandboxed process: an allow-list of the system calls CPython needs to
run a completion and answer the tests. Every other call fails with EPERM.

Not imported by the harness: `suites.sandbox` passes this file's code to the sandboxed
interpreter, which loads it as the module `sandbox_filter`. The filter is built with libseccomp
through its binding pyseccomp, which the preamble loaded from the host's copy before it confined
itself. Where either is missing, `install` puts the hand-encoded deny-list of `denylist.py` in
force instead. `isolation` names the one that is in force: "seccomp (allow-list, libseccomp
2.5.4)" or "seccomp (deny-list, hand-encoded BPF: <why>)".

How the list was made: each name below is a call that CPython 3.11 on glibc makes while it runs
HumanEval's canonical solutions, the code suite's references and a completion that uses
threads, files, pipes, select, time, randomness and signals. `strace -f` after the filter's
installation gave the calls. The few calls that newer versions of glibc or CPython use instead
of these are listed beside them (statx, faccessat2, fchmodat2, epoll_pwait2, close_range, rseq).
What the list leaves out is refused even if nobody thought of it. That covers the whole of
denylist.py, and also calls the deny-list lets through: sync, syncfs, flock, personality,
setpriority, sched_setaffinity, inotify, prctl(PR_SET_DUMPABLE), any ioctl but six, and the
calls that flush the host's disk (fsync, fdatasync, sync_file_range, msync with MS_SYNC, opens
with O_SYNC or O_DSYNC, pwritev2 with RWF_SYNC or RWF_DSYNC).
Where the process has no filesystem view (the kernel refused namespaces), chmod and utime are
left out as well: Landlock does not cover them, and only the view's read-only mounts keep them off
the host's files. So is creating files and folders (mkdir, rename, link, symlink, truncate,
O_CREAT, O_TMPFILE): without the view's capped tmpfs the run writes nothing on the host's disk.

Why EPERM and not kill for a call outside the list: the call does not happen either way. But
EPERM becomes a PermissionError that the grader reports as "forbidden: PermissionError ...",
and libc and CPython handle it where a call is only a probe or a shortcut. shutil, for one, asks
for extended attributes it then ignores. Killing the process would fail correct completions
whose interpreter makes such a call, and tell a reader only "killed by the seccomp filter".
A call from another ABI (x32, 32-bit code) still kills the process: nothing here is built for
one, so it can only be an attempt to get around the list.
"""

import errno
import sys

CLONE_THREAD = 0x00010000
# Namespace flags: a thread never needs one (and without capabilities the kernel refuses them).
NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
OWN_PID = "own pid"  # filled in by `install` with the process's pid
PR_SET_NAME, PR_GET_NAME = 15, 16
MS_SYNC = 4
# fcntl: descriptor flags, duplication, a pipe's size, record locks (sqlite takes them on files
# in /tmp). Not F_SETOWN, F_SETOWN_EX, F_SETSIG, F_SETLEASE or F_NOTIFY: they make the kernel
# signal a process we name. Not F_SETPIPE_SZ: a pipe's buffer is kernel memory that no /proc
# status counts, so the memory watch cannot see it (1 MiB a pipe, ~30 pipes: 29 MiB past the
# cap); at the default size the open-files cap bounds them to ~2 MiB.
FCNTL_ALLOWED = (0, 1, 2, 3, 4, 5, 6, 7, 1030, 1032)  # F_DUPFD..F_SETLKW, F_DUPFD_CLOEXEC, F_GETPIPE_SZ
# ioctl: isatty (TCGETS), the terminal's size (TIOCGWINSZ), bytes waiting (FIONREAD), blocking
# (FIONBIO) and close-on-exec (FIOCLEX, FIONCLEX): CPython sets the last three with ioctl.
IOCTL_ALLOWED = (0x5401, 0x5413, 0x541B, 0x5421, 0x5451, 0x5450)

ALLOWED = {
    # The interpreter's memory: the heap, its arenas, libraries, thread stacks and guard pages.
    # Not msync with MS_SYNC (below): it writes back a shared file mapping, a disk flush.
    "memory": ("brk", "mmap", "munmap", "mremap", "mprotect", "madvise"),
    # Descriptors it holds: the pipes to the other process and the grader, files it opened.
    # Not fsync, fdatasync or sync_file_range: on any file, even one open read-only in the
    # view, each is a flush of the host's disk, and a graded program needs none of them.
    "descriptors": ("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv",
                    "pwritev", "preadv2", "lseek", "close", "close_range", "dup",
                    "dup2", "dup3", "fstat", "ftruncate", "sendfile", "copy_file_range", "pipe",
                    "pipe2"),
    # Waiting on descriptors (select, selectors).
    "polling": ("select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1",
                "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2"),
    # Looking paths up and reading them: imports walk the standard library. The filesystem view
    # and Landlock decide what there is to see.
    "paths": ("stat", "lstat", "newfstatat", "statx", "access", "faccessat",
              "faccessat2", "readlink", "readlinkat", "getdents64", "getcwd", "chdir", "fchdir",
              "statfs", "fstatfs", "getxattr", "lgetxattr", "fgetxattr", "listxattr",
              "llistxattr", "flistxattr"),
    # Changing files and folders. Only the run's own /tmp is writable (read-only mounts and
    # Landlock, which covers each of these), so they reach nothing else. Not mknod: no devices
    # or FIFOs.
    "file changes": ("rmdir", "unlink", "unlinkat", "umask"),
    # Making folders, links and names. Only inside the filesystem view, whose /tmp is a tmpfs
    # capped in size and inodes: without it (no namespaces) the run would write on the host's
    # disk with nothing to bound it, so it creates nothing there (open without O_CREAT too).
    "creating": ("mkdir", "mkdirat", "rename", "renameat", "renameat2", "link", "linkat",
                 "symlink", "symlinkat", "truncate"),
    # Modes and times. Landlock does not cover them, so they are allowed only inside the
    # filesystem view, where everything but /tmp is a read-only mount. Without it (no
    # namespaces) they could change the host's files of the same uid.
    "metadata": ("chmod", "fchmod", "fchmodat", "fchmodat2", "utimensat", "utime", "utimes",
                 "futimesat"),
    # Threads (clone is below, threads only) and what they synchronise with.
    "threads": ("futex", "set_robust_list", "rseq", "sched_yield", "sched_getaffinity",
                "gettid", "exit", "exit_group", "restart_syscall"),
    # Signals to itself: handlers, masks, alarms and interval timers (kill and tgkill below).
    "signals": ("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending",
                "rt_sigsuspend", "rt_sigtimedwait", "sigaltstack", "alarm", "setitimer",
                "getitimer", "pause"),
    # Clocks and sleeping (most clock reads never leave the vDSO).
    "time": ("clock_gettime", "clock_getres", "gettimeofday", "time", "nanosleep",
             "clock_nanosleep", "times"),
    # Facts about itself and randomness.
    "identity": ("getpid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getresuid",
                 "getresgid", "getgroups", "getpgrp", "uname", "getrusage", "getrandom"),
}

# (name, action, condition): allowed only where the condition on one argument holds, as
# (argument index, "eq" value) or (index, "masked_eq", mask, value).
CONDITIONAL = (
    # msync without MS_SYNC (MS_ASYNC, MS_INVALIDATE): no flush of the disk.
    ("msync", "allow", (2, "masked_eq", MS_SYNC, 0)),
    # Threads, never processes: clone with CLONE_THREAD and no namespace flag.
    ("clone", "allow", (0, "masked_eq", CLONE_THREAD | NAMESPACES, CLONE_THREAD)),
    # glibc tries clone3 for threads first and falls back to clone only on ENOSYS.
    ("clone3", "enosys", None),
    # Signals to itself only (raise() is tgkill(getpid(), gettid(), sig)).
    ("kill", "allow", (0, "eq", OWN_PID)),
    ("tgkill", "allow", (0, "eq", OWN_PID)),
    # Its own limits only: getrlimit and setrlimit are prlimit64(0, ...).
    ("prlimit64", "allow", (0, "eq", 0)),
    *(("fcntl", "allow", (1, "eq", cmd)) for cmd in FCNTL_ALLOWED),
    *(("ioctl", "allow", (1, "eq", request)) for request in IOCTL_ALLOWED),
    # Thread names (newer CPython names its threads).
    ("prctl", "allow", (0, "eq", PR_SET_NAME)),
    ("prctl", "allow", (0, "eq", PR_GET_NAME)),
)


ONLY_IN_VIEW = ("metadata", "creating")
# open and openat (the flags are argument 1 and 2): never O_SYNC or O_DSYNC (each write a flush of
# the host's disk; O_SYNC holds O_DSYNC's bit); outside the view not O_CREAT or O_TMPFILE either.
OPENS = (("open", 1), ("openat", 2))
O_CREAT, O_DSYNC, O_TMPFILE_BIT = 0o100, 0o10000, 0o20000000
RWF_DSYNC, RWF_SYNC = 2, 4  # pwritev2's flags (argument 5): a flush per write


def allowed_names(view: bool = True) -> list:
    """Every call allowed whatever its arguments, group by group (`view`: inside the filesystem
    view; without it the groups of ONLY_IN_VIEW are left out)."""
    return [name for group, names in ALLOWED.items() if view or group not in ONLY_IN_VIEW
            for name in names]


def build(seccomp, pid: int, view: bool = True, threads: bool = True):
    """The allow-list as a pyseccomp SyscallFilter (not loaded). `threads`: something counts the
    process's threads (RLIMIT_NPROC in a uid of its own, a pids cgroup); without it clone is
    refused, since no seccomp condition can count threads."""
    f = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))
    f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    actions = {"allow": seccomp.ALLOW, "enosys": seccomp.ERRNO(errno.ENOSYS)}
    rules = [(name, "allow", None) for name in allowed_names(view)]
    refused = O_DSYNC | (0 if view else O_CREAT | O_TMPFILE_BIT)
    rules += [(name, "allow", (index, "masked_eq", refused, 0)) for name, index in OPENS]
    rules.append(("pwritev2", "allow", (5, "masked_eq", RWF_DSYNC | RWF_SYNC, 0)))
    rules += [rule for rule in CONDITIONAL if threads or rule[0] != "clone"]
    for name, action, condition in rules:
        number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        if number == -1:  # unknown to this libseccomp (a call newer than it): stays refused
            continue
        args = []
        if condition is not None:
            index, op, *data = condition
            data = [pid if d == OWN_PID else d for d in data]
            args.append(seccomp.Arg(index, seccomp.EQ if op == "eq" else seccomp.MASKED_EQ, *data))
        f.add_rule(actions[action], number, *args)
    return f


def _version(seccomp) -> str:
    import ctypes

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    get = seccomp._libseccomp.seccomp_version
    get.restype = ctypes.POINTER(Version)
    v = get().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def install(libc, pid: int, missing: str | None, view: bool, threads: bool = True) -> str:
    """Install the allow-list on this thread and the threads it will start; the layer's name.
    `missing`: why pyseccomp could not be loaded (then the deny-list is installed instead);
    `view`: the process is inside the filesystem view (its read-only mounts); `threads`:
    something counts its threads (else clone is refused)."""
    seccomp = sys.modules.get("pyseccomp")
    deny = sys.modules["sandbox_denylist"]
    if seccomp is None:
        return deny.install(libc, pid, missing or "pyseccomp not loaded", threads=threads, view=view)
    try:
        build(seccomp, pid, view, threads).load()
    except OSError as exc:  # e.g. a kernel without the seccomp() call: the older interface remains
        return deny.install(libc, pid, f"libseccomp failed: {exc}", threads=threads, view=view)
    notes = ("" if view else ", no chmod, utime or file creation") + ("" if threads else ", no threads")
    return f"seccomp (allow-list, libseccomp {_version(seccomp)}{notes})"
