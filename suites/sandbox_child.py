"""The trusted preamble that confines a sandboxed Python process, then runs the untrusted code.

This file is not imported by the harness: `suites.sandbox` reads its source and runs it with
`python -I -S -B -c`, so it must stay self-contained (standard library only, no package imports).
The parent writes one JSON object to our stdin (the code, the tests, the limits, a nonce and the
number of a status pipe) and reads two JSON lines back from the status pipe: `ready` (which
confinement layers were applied) and `done` (the outcome). Output of the untrusted code goes to
stdout/stderr as usual.

Layers, applied in this order, each best effort and each reported in `isolation`:
1. namespaces: a new network namespace (no interfaces but a downed loopback: nothing is
   reachable) and a new mount namespace in which every mount is read-only except the temporary
   directory. As root this needs no user namespace; otherwise one is tried.
2. capabilities: all are dropped (bounding set included) so the code cannot undo the mounts,
   and `no_new_privs` is set.
3. rlimits: CPU seconds, address space, file size, open files, no core files, and processes
   (the kernel exempts uid 0 from RLIMIT_NPROC, hence layer 4).
4. seccomp: a BPF filter that denies creating processes (fork, vfork, clone without
   CLONE_THREAD, clone3), exec, sockets, signalling other processes, ptrace and reading or
   writing other processes' memory, mounts and namespace changes, and io_uring.
5. an audit hook (PEP 578) that refuses, with a readable reason, writes outside the temporary
   directory, process creation, sockets, ctypes and rlimit changes. The hook is what produces
   "forbidden: ..." reasons; it is NOT a security boundary (native code can bypass it), layers
   1-4 are the backstop.

None of this keeps the code from cheating its own tests (it runs in the same interpreter as them):
the sandbox protects the host, not the score.
"""

import ctypes
import json
import linecache
import os
import resource
import sys
import threading
import traceback

# --- Linux constants (x86_64 and aarch64 share these) ---------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscall table)
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
EPERM = 1
ENOSYS = 38

# Syscall numbers per architecture: (audit arch, {name: nr}).
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322,
        "socket": 41, "socketpair": 53, "kill": 62, "tkill": 200, "tgkill": 234,
        "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308,
        "mount": 165, "umount2": 166, "mount_setattr": 442, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427,
    }),
    "aarch64": (0xC00000B7, {
        "clone": 220, "clone3": 435, "execve": 221, "execveat": 281, "socket": 198,
        "socketpair": 199, "kill": 129, "tkill": 130, "tgkill": 131, "pidfd_send_signal": 424,
        "pidfd_open": 434, "pidfd_getfd": 438, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427,
    }),
}

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _mount_setattr(path, recursive, set_flags, clear_flags):
    attr = _MountAttr(set_flags, clear_flags, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    ret = libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, os.fsencode(path), flags,
                       ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    _check(ret, f"mount_setattr({path})")


def enter_namespaces(tmpdir, isolation):
    """New network + mount namespaces; everything read-only except `tmpdir`."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET
    try:
        if uid == 0:
            _check(libc.unshare(flags), "unshare")
        else:
            # An unprivileged user needs a user namespace to own the new ones.
            _check(libc.unshare(flags | CLONE_NEWUSER), "unshare")
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
    except (OSError, AttributeError) as exc:  # AttributeError: a libc without unshare()
        isolation.append(f"no-namespaces ({getattr(exc, 'strerror', None) or exc})")
        return
    isolation.append("netns")
    try:
        # Private propagation first, so nothing done here leaks back to the host's mounts.
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make-private")
        # A bind mount makes tmpdir its own mount, whose read-only flag can then be cleared.
        btmp = os.fsencode(tmpdir)
        _check(libc.mount(btmp, btmp, None, MS_BIND, None), "bind tmpdir")
        _mount_setattr("/", True, MOUNT_ATTR_RDONLY, 0)
        _mount_setattr(tmpdir, False, 0, MOUNT_ATTR_RDONLY)
        isolation.append("readonly-fs")
    except (OSError, AttributeError) as exc:
        isolation.append(f"writable-fs ({getattr(exc, 'strerror', None) or exc})")


def drop_privileges(isolation):
    """Empty the bounding set and every capability set, then set no_new_privs.

    As root this stops the code from undoing the mounts; an unprivileged user who entered a user
    namespace holds full capabilities inside it, and loses them here too.
    """

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    try:
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails without CAP_SETPCAP or past the last
        header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        _check(libc.capset(ctypes.byref(header), ctypes.byref((Data * 2)())), "capset")
        isolation.append("no-capabilities")
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    except (OSError, AttributeError) as exc:
        isolation.append(f"capabilities-kept ({getattr(exc, 'strerror', None) or exc})")


def set_rlimits(limits, isolation):
    cpu = int(limits["cpu_s"])
    pairs = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL at the hard
        (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (limits["open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NPROC, (1, 1)),  # one task per uid: no forks (uid 0 is exempt)
    ]
    for which, (soft, hard) in pairs:
        _, inherited = resource.getrlimit(which)
        if inherited != resource.RLIM_INFINITY:  # a limit may only be lowered, never raised
            soft, hard = min(soft, inherited), min(hard, inherited)
        resource.setrlimit(which, (soft, hard))
    isolation.append("rlimits")


def _seccomp_program(pid):
    """A BPF program (list of (code, jt, jf, k)) denying process creation, exec, sockets..."""
    arch = os.uname().machine
    if arch not in SYSCALLS:
        return None
    audit_arch, nr = SYSCALLS[arch]
    LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ARG0_LOW = 16  # offsetof(seccomp_data, args[0]), low 32 bits on little-endian machines
    # io_uring is denied because its operations (socket, connect, open) bypass seccomp.
    deny = [nr[n] for n in ("fork", "vfork", "execve", "execveat", "socket", "socketpair",
                            "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open",
                            "pidfd_getfd", "pidfd_send_signal", "unshare", "setns", "mount",
                            "umount2", "mount_setattr", "io_uring_setup", "io_uring_enter",
                            "io_uring_register") if n in nr]
    own_pid_only = [nr[n] for n in ("kill", "tgkill")]
    # Instructions with symbolic jump targets, resolved below (BPF jumps are forward only).
    prog = [("ld", 4), ("jeq", audit_arch, None, "kill"), ("ld", 0)]
    if arch == "x86_64":
        prog.append(("jge", 0x40000000, "eperm", None))  # the x32 ABI: refuse it outright
    prog += [("jeq", n, "eperm", None) for n in deny]
    prog.append(("jeq", nr["clone3"], "enosys", None))  # glibc falls back to clone for threads
    prog.append(("jeq", nr["clone"], "clone", None))
    prog.append(("jeq", nr["tkill"], "eperm", None))
    prog += [("jeq", n, "self", None) for n in own_pid_only]
    prog += [("ret", SECCOMP_RET_ALLOW),
             ("label", "clone"), ("ld", ARG0_LOW), ("jset", CLONE_THREAD, "allow", "eperm"),
             ("label", "self"), ("ld", ARG0_LOW), ("jeq", pid, "allow", "eperm"),
             ("label", "allow"), ("ret", SECCOMP_RET_ALLOW),
             ("label", "eperm"), ("ret", SECCOMP_RET_ERRNO | EPERM),
             ("label", "enosys"), ("ret", SECCOMP_RET_ERRNO | ENOSYS),
             ("label", "kill"), ("ret", SECCOMP_RET_KILL_PROCESS)]
    labels, index = {}, 0
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = index
        else:
            index += 1
    out, index = [], 0
    for ins in prog:
        op = ins[0]
        if op == "label":
            continue

        def rel(target):
            return 0 if target is None else labels[target] - index - 1

        if op == "ld":
            out.append((LD_ABS, 0, 0, ins[1]))
        elif op == "ret":
            out.append((RET, 0, 0, ins[1]))
        else:
            code = {"jeq": JEQ, "jge": JGE, "jset": JSET}[op]
            out.append((code, rel(ins[2]), rel(ins[3]), ins[1]))
        index += 1
    return out


def install_seccomp(isolation):
    program = _seccomp_program(os.getpid())
    if program is None:
        isolation.append(f"no-seccomp (unsupported arch {os.uname().machine})")
        return

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(program))(*[SockFilter(*ins) for ins in program])
    fprog = SockFprog(len(program), filters)
    try:
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
               "seccomp")
        isolation.append("seccomp")
    except (OSError, AttributeError) as exc:
        isolation.append(f"no-seccomp ({getattr(exc, 'strerror', None) or exc})")


class SandboxViolation(PermissionError):
    """Raised by the audit hook; the first one is also recorded, so catching it does not help."""


def install_audit_hook(tmpdir, violations):
    root = os.path.realpath(tmpdir)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    # Events refused outright (prefix match on the event name).
    refused = ("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
               "os.kill", "os.killpg", "subprocess.", "pty.", "signal.pthread_kill",
               "socket.", "ctypes.", "resource.setrlimit", "resource.prlimit",
               "sqlite3.enable_load_extension", "sqlite3.load_extension", "os.startfile",
               "os.add_dll_directory", "webbrowser.open")
    # Events whose listed arguments are paths that must lie inside tmpdir.
    path_args = {"os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,),
                 "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1), "os.symlink": (1,),
                 "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,),
                 "os.lchflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
                 "shutil.rmtree": (0,), "sqlite3.connect": (0,), "shutil.chown": (0,),
                 "tempfile.mkstemp": (0,), "tempfile.mkdtemp": (0,)}
    guard = threading.local()  # per thread: one thread in the hook must not disable it for all

    def inside(path):
        if isinstance(path, int) or path is None:
            return True  # an already-open descriptor (its open was checked) or no path at all
        try:
            text = os.fsdecode(path)
        except TypeError:
            return False
        if text in ("", ":memory:", os.devnull):
            return text != ""
        real = os.path.realpath(text)
        return real == root or real.startswith(root + os.sep)

    def refuse(what):
        if not violations:
            violations.append(what)
        raise SandboxViolation(f"sandbox: forbidden: {what}")

    def hook(event, args):
        if getattr(guard, "busy", False):
            return  # realpath and friends inside the hook must not re-enter it
        guard.busy = True
        try:
            if event == "open":
                path, mode, flags = args
                writes = (any(c in mode for c in "wax+") if isinstance(mode, str)
                          else bool((flags or 0) & write_flags))
                if writes and not inside(path):
                    refuse(f"open({os.fsdecode(path)!r}) for writing outside the sandbox dir")
            elif event.startswith(refused):
                refuse(event)
            elif event in path_args:
                for i in path_args[event]:
                    if i < len(args) and not inside(args[i]):
                        refuse(f"{event}({os.fsdecode(args[i])!r}) outside the sandbox dir")
        finally:
            guard.busy = False

    sys.addaudithook(hook)


def _send(fd, nonce, **message):
    os.write(fd, (json.dumps(dict(message, nonce=nonce)) + "\n").encode())


def _format_error(exc, limit=2000):
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and frames[-1].filename in ("<solution>", "<tests>"):
        # Say where: a bare "AssertionError" does not tell which test failed.
        last = frames[-1]
        text += f" ({last.filename} line {last.lineno}: {(last.line or '').strip()[:200]})"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4))
    return text[:limit], tb[-4 * limit:]


def classify(exc, violations):
    """Map what stopped the code to an outcome word."""
    if violations:
        return "forbidden", violations[0]
    if exc is None:
        return "ok", ""
    text, _ = _format_error(exc)
    if isinstance(exc, MemoryError):
        return "memory", text
    if isinstance(exc, OSError) and exc.errno == 27:  # EFBIG: RLIMIT_FSIZE (SIGXFSZ is ignored)
        return "file_size", text
    if isinstance(exc, OSError) and exc.errno in (1, 13, 30):  # EPERM, EACCES, EROFS
        return "forbidden", text  # stopped by a kernel layer rather than by the hook
    if isinstance(exc, AssertionError):
        return "failed", text
    return "error", text


def main():
    config = json.loads(sys.stdin.buffer.read())
    # From here on the untrusted code must see neither the nonce nor the config on stdin.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status_fd, nonce, tmpdir = config["status_fd"], config["nonce"], config["tmpdir"]
    isolation = []
    if config["isolate"]:
        enter_namespaces(tmpdir, isolation)
        drop_privileges(isolation)
    os.chdir(tmpdir)
    set_rlimits(config["limits"], isolation)
    if config["isolate"]:
        install_seccomp(isolation)
    violations = []
    if config["audit_hook"]:
        install_audit_hook(tmpdir, violations)
        isolation.append("audit-hook")
    _send(status_fd, nonce, event="ready", isolation=isolation)

    namespace = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    error, trace = None, ""
    try:
        for filename, source in (("<solution>", config["code"]), ("<tests>", config["tests"])):
            # Registered so tracebacks can quote the failing line.
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            exec(compile(source, filename, "exec"), namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the tests did not run
        error = exc
        trace = _format_error(exc)[1]
    outcome, detail = classify(error, violations)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _send(status_fd, nonce, event="done", outcome=outcome, detail=detail, traceback=trace)
    # os._exit skips atexit handlers and finalizers the untrusted code may have registered.
    os._exit(0)


if __name__ == "__main__":  # run via `python -c`; importing this module does nothing
    main()
