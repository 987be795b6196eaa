"""The fallback seccomp filter, a hand-encoded BPF deny-list: which system calls a sandboxed
process may not make. In force only where libseccomp (or its binding, pyseccomp) is missing;
`filter.py` has the allow-list that is used everywhere else, and `isolation` says which one a
run got ("seccomp (deny-list, hand-encoded BPF: <why>)").

Not imported by the harness: `suites.sandbox` passes this file's code to the sandboxed
interpreter, which loads it as a module `sandbox_denylist` (standard library only). The tests
import `SYSCALLS` for the numbers their ctypes attacks use.

A deny list is weaker than the allow-list: any call nobody thought of is allowed (`flock`, `personality`, `prctl(PR_SET_DUMPABLE)`... tests/test_sandbox_seccomp.py shows them).
Denied here:
- creating processes (fork, vfork, clone without CLONE_THREAD, clone3 answers ENOSYS so that
  glibc falls back to clone for threads) and exec;
- sockets, io_uring (its operations bypass seccomp);
- anything aimed at another process: kill/tgkill/rt_sigqueueinfo/rt_tgsigqueueinfo/prlimit64
  except on ourselves, tkill, pidfd_*, ptrace, process_vm_*, kcmp, move_pages, migrate_pages,
  process_madvise/mrelease, and the fcntl commands that make the kernel signal someone on our
  behalf (F_SETOWN, F_SETOWN_EX, F_SETSIG, F_SETLEASE, F_NOTIFY), and F_SETPIPE_SZ (a pipe's
  buffer is memory the host's memory watch cannot see);
- shared state outside the process: SysV IPC (shm*, sem*, msg*), POSIX message queues (mq_*),
  the kernel keyrings (add_key, request_key, keyctl), memfd_create/memfd_secret (memory no
  rlimit counts), mknod/mknodat;
- flushing the host's disks: sync, syncfs, fsync, fdatasync, sync_file_range, open/openat with
  O_SYNC or O_DSYNC, pwritev2 with RWF_SYNC or RWF_DSYNC (msync with MS_SYNC is refused by the
  allow-list only);
- without the filesystem view (no namespaces), creating anything on the host's disk: creat,
  mkdir, rename, link, symlink, truncate and their *at forms, open/openat with O_CREAT or
  O_TMPFILE;
- changing the confinement: mount and the new mount API, pivot_root, chroot, unshare, setns,
  bpf, perf_event_open, userfaultfd, open_by_handle_at, module and kexec loading, reboot,
  swap, acct, syslog, quotactl, Landlock (a new ruleset could only restrict further, but
  nothing here needs it).
Every denied call fails with EPERM (clone3: ENOSYS); a call from another ABI (x32 on x86_64, or
32-bit code) kills the process.
"""

import ctypes
import os

CLONE_THREAD = 0x00010000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
EPERM, ENOSYS = 1, 38
# fcntl commands that deliver signals or leases to a process we name (asm-generic/fcntl.h), and
# F_SETPIPE_SZ (a pipe's buffer is memory the host's memory watch cannot see).
# F_SETOWN, F_SETOWN_EX, F_SETSIG, F_SETLEASE, F_NOTIFY, F_SETPIPE_SZ
FCNTL_DENIED = (8, 15, 10, 1024, 1026, 1031)

_COMMON = ("clone3", "pidfd_send_signal", "pidfd_open", "pidfd_getfd", "mount_setattr",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "memfd_secret", "fsopen",
           "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "process_madvise",
           "process_mrelease", "landlock_create_ruleset", "landlock_add_rule",
           "landlock_restrict_self")
_NEW = {n: nr for n, nr in zip(_COMMON, (435, 424, 434, 438, 442, 425, 426, 427, 447, 430, 431,
                                         432, 433, 428, 429, 440, 448, 444, 445, 446))}

# (audit arch, {name: number}); the numbers are checked against the kernel headers.
SYSCALLS = {
    "x86_64": (0xC000003E, dict(_NEW, **{
        "fork": 57, "vfork": 58, "clone": 56, "execve": 59, "execveat": 322, "socket": 41,
        "socketpair": 53, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "prlimit64": 302, "fcntl": 72, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "move_pages": 279,
        "migrate_pages": 256, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67,
        "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69,
        "msgrcv": 70, "msgctl": 71, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242,
        "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245, "add_key": 248,
        "request_key": 249, "keyctl": 250, "memfd_create": 319, "mknod": 133, "mknodat": 259,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169,
        "swapon": 167, "swapoff": 168, "acct": 163, "syslog": 103, "quotactl": 179,
        "sync": 162, "syncfs": 306, "fsync": 74, "fdatasync": 75, "sync_file_range": 277,
        "open": 2, "openat": 257, "creat": 85, "pwritev2": 328, "mkdir": 83, "mkdirat": 258,
        "rename": 82, "renameat": 264, "renameat2": 316, "link": 86, "linkat": 265,
        "symlink": 88, "symlinkat": 266, "truncate": 76,
    })),
    "aarch64": (0xC00000B7, dict(_NEW, **{
        "clone": 220, "execve": 221, "execveat": 281, "socket": 198, "socketpair": 199,
        "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
        "rt_tgsigqueueinfo": 240, "prlimit64": 261, "fcntl": 25, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "move_pages": 239,
        "migrate_pages": 238, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "shmget": 194, "shmat": 196, "shmctl": 195,
        "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191, "semtimedop": 192,
        "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180,
        "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184,
        "mq_getsetattr": 185, "add_key": 217, "request_key": 218, "keyctl": 219,
        "memfd_create": 279, "mknodat": 33, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
        "kexec_file_load": 294, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89,
        "syslog": 116, "quotactl": 60, "sync": 81, "syncfs": 267, "fsync": 82, "fdatasync": 83,
        "sync_file_range": 84, "openat": 56, "pwritev2": 287, "mkdirat": 34, "renameat": 38,
        "renameat2": 276, "linkat": 37, "symlinkat": 36, "truncate": 45,
    })),
}

DENIED = ("fork", "vfork", "execve", "execveat", "socket", "socketpair", "tkill", "ptrace",
          "process_vm_readv", "process_vm_writev", "kcmp", "move_pages", "migrate_pages",
          "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "process_madvise",
          "process_mrelease", "unshare", "setns", "mount", "umount2", "mount_setattr",
          "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "pivot_root",
          "chroot", "io_uring_setup", "io_uring_enter", "io_uring_register", "shmget", "shmat",
          "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
          "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
          "mq_notify", "mq_getsetattr", "add_key", "request_key", "keyctl", "memfd_create",
          "memfd_secret", "mknod", "mknodat", "bpf", "perf_event_open", "userfaultfd",
          "open_by_handle_at", "name_to_handle_at", "init_module", "finit_module",
          "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
          "acct", "syslog", "quotactl", "landlock_create_ruleset", "landlock_add_rule",
          "landlock_restrict_self", "sync", "syncfs", "fsync", "fdatasync", "sync_file_range")
# Without the filesystem view (no namespaces) the run creates nothing on the host's disk: these
# are denied, and so are open/openat with O_CREAT or O_TMPFILE (with O_SYNC/O_DSYNC: always).
CREATING = ("creat", "mkdir", "mkdirat", "rename", "renameat", "renameat2", "link", "linkat",
            "symlink", "symlinkat", "truncate")
O_CREAT, O_DSYNC, O_TMPFILE_BIT = 0o100, 0o10000, 0o20000000
RWF_DSYNC, RWF_SYNC = 2, 4
# Allowed only when their first argument (a pid or thread group id) is our own pid, or 0 for
# prlimit64 (which means ourselves).
OWN_PID_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "prlimit64")


def program(pid: int, arch: str | None = None, threads: bool = True, view: bool = True):
    """The BPF program as (code, jt, jf, k) tuples, or None on an architecture not listed.
    `threads`: clone is allowed for threads (else refused: nothing would count them); `view`:
    inside the filesystem view (else nothing may be created: CREATING and O_CREAT)."""
    arch = arch or os.uname().machine
    if arch not in SYSCALLS:
        return None
    audit_arch, nr = SYSCALLS[arch]
    LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ARG0, ARG1, ARG2, ARG5 = 16, 24, 32, 56  # offsetof(seccomp_data, args[i]), low 32 bits (little-endian)
    opening = O_DSYNC | (0 if view else O_CREAT | O_TMPFILE_BIT)
    prog = [("ld", 4), ("jeq", audit_arch, None, "kill"), ("ld", 0)]
    if arch == "x86_64":
        prog.append(("jge", 0x40000000, "eperm", None))  # the x32 ABI: refuse it outright
    prog += [("jeq", nr[n], "eperm", None) for n in DENIED + (() if view else CREATING) if n in nr]
    prog += [("jeq", nr[n], label, None) for n, label in (("open", "open"), ("openat", "openat"),
                                                          ("pwritev2", "pwritev2")) if n in nr]
    prog.append(("jeq", nr["clone3"], "enosys", None))  # glibc falls back to clone for threads
    prog.append(("jeq", nr["clone"], "clone", None))
    prog.append(("jeq", nr["fcntl"], "fcntl", None))
    prog.append(("jeq", nr["prlimit64"], "prlimit", None))
    prog += [("jeq", nr[n], "self", None) for n in OWN_PID_ONLY if n != "prlimit64"]
    prog += [("ret", SECCOMP_RET_ALLOW),
             ("label", "clone"), ("ld", ARG0), ("jset", CLONE_THREAD if threads else 0, "allow", "eperm"),
             ("label", "open"), ("ld", ARG1), ("jset", opening, "eperm", "allow"),
             ("label", "openat"), ("ld", ARG2), ("jset", opening, "eperm", "allow"),
             ("label", "pwritev2"), ("ld", ARG5), ("jset", RWF_DSYNC | RWF_SYNC, "eperm", "allow"),
             ("label", "fcntl"), ("ld", ARG1)]
    prog += [("jeq", cmd, "eperm", None) for cmd in FCNTL_DENIED]
    prog += [("ret", SECCOMP_RET_ALLOW),
             ("label", "prlimit"), ("ld", ARG0), ("jeq", 0, "allow", None),
             ("label", "self"), ("ld", ARG0), ("jeq", pid, "allow", "eperm"),
             ("label", "allow"), ("ret", SECCOMP_RET_ALLOW),
             ("label", "eperm"), ("ret", SECCOMP_RET_ERRNO | EPERM),
             ("label", "enosys"), ("ret", SECCOMP_RET_ERRNO | ENOSYS),
             ("label", "kill"), ("ret", SECCOMP_RET_KILL_PROCESS)]
    return _assemble(prog, {"ld": LD_ABS, "ret": RET, "jeq": JEQ, "jge": JGE, "jset": JSET})


def _assemble(prog, codes):
    """Resolve symbolic jump targets (BPF jumps are forward only, relative to the next one)."""
    labels, index = {}, 0
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = index
        else:
            index += 1
    out = []
    for ins in prog:
        if ins[0] == "label":
            continue
        here = len(out)

        def rel(target):
            offset = 0 if target is None else labels[target] - here - 1
            assert 0 <= offset <= 255, "a BPF jump reaches at most 255 instructions ahead"
            return offset

        if ins[0] in ("ld", "ret"):
            out.append((codes[ins[0]], 0, 0, ins[1]))
        else:
            out.append((codes[ins[0]], rel(ins[2]), rel(ins[3]), ins[1]))
    return out


def install(libc, pid: int, why: str, threads: bool = True, view: bool = True) -> str:
    """Install the filter on this thread and its future threads; the layer's name (with `why`
    the allow-list is not in force), or why not."""
    prog = program(pid, threads=threads, view=view)
    if prog is None:
        return f"no-seccomp (unsupported arch {os.uname().machine})"

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"no-seccomp ({os.strerror(ctypes.get_errno())})"
    notes = ("" if threads else "; no threads") + ("" if view else "; no file creation")
    return f"seccomp (deny-list, hand-encoded BPF: {why}{notes})"
