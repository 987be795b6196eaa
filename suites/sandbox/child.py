"""The trusted preamble of a sandboxed process: it confines itself, then plays its role.

Not imported by the harness: `suites.sandbox` starts `python -I -S -B -c BOOTSTRAP`, which
reads from stdin this module's code, compiled, and the config (the code, limits, the filesystem
view, the numbers of its pipes, and the compiled `sandbox_wire`, `sandbox_filter` and
`sandbox_denylist`, loaded here as modules, and pyseccomp's code with the host's answers to where
its libraries are), then calls `main(config)`. It must stay self-contained: standard library
only, apart from pyseccomp, which it is given.

`main` forks the two processes that grade one program, each confining itself for its role: the
tests' (role "tests": reads the prefix and tests from a pipe only it holds, executes them, every
use of a candidate's name being a request; it alone reports the verdict) and the candidate's
(role "candidate": executes the code, then answers requests; see wire.py). `main` then
only waits, and reports how the candidate's process ended.

Layers, in the order applied, each reported by name in `isolation` (or why it is missing):
1. namespaces: the process forks; the child unshares user (where allowed: root inside is an
   unprivileged uid of its own outside), PID, mount, network, IPC, UTS and cgroup namespaces,
   and a time namespace (its boot-time and monotonic clocks moved back to about zero), and
   forks again into pid 1 of the new PID namespace. The processes left behind only wait and
   pass the exit status up (dying of the same signal); they hold no pipe.
2. a filesystem view: a fresh tmpfs root holding, read-only, only the host's allow-list
   (parent._view: the interpreter, its standard library folders with their package folders
   covered by an empty tmpfs, ld.so.cache, the shared objects it links, and the links to
   them); /dev with
   null, zero, full, random and urandom; a /proc of the new PID namespace; a private tmpfs /tmp
   capped in size and inodes (the working directory, gone with the namespace). pivot_root, and
   the host's tree is detached: no home, no /tmp, no other run, no /proc of the host is visible.
3. Landlock (where the kernel has it): reading only the view, writing only /tmp and the
   devices; no TCP; no signals and no abstract Unix sockets outside the process (ABI 6). Without
   namespaces this is what keeps the host's files out of reach, reading the same allow-list
   (no package folder, no data); without it we refuse.
4. capabilities: all dropped (bounding set included); no_new_privs; not dumpable (no core
   files, and no other process of the same uid may read our memory or descriptors).
5. rlimits: CPU seconds, address space, file size, open files, no core files, and (in a user
   namespace, where it counts only our own uid) processes, which caps threads. Where neither
   that nor the run's pids cgroup counts threads, the seccomp filter refuses clone.
6. seccomp: an allow-list built with libseccomp (filter.py; pyseccomp, the host's copy, is loaded
   before confinement), or, where libseccomp is missing, the deny-list of denylist.py.
7. for the candidate, an audit hook (PEP 578) that refuses, with a readable reason, writes
   outside /tmp, process creation, sockets, ctypes and rlimit changes. It produces the
   "forbidden: ..." reasons; it is NOT a boundary (Python code can disable it), 1-6 are.
The candidate's process writes its `ready` line (the layers) and closes its status pipe before
it runs any untrusted code, so nothing it writes can reach the host as a status.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time

CLONE_NEWTIME, CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00000080, 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscall table)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD, SYS_LANDLOCK_RESTRICT = 444, 445, 446
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 4, 24, 38

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _why(exc):
    return getattr(exc, "strerror", None) or str(exc)


def _mount(source, target, fstype, flags, data=None):
    enc = (lambda s: None if s is None else os.fsencode(s))
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _mount_setattr(path, set_flags, recursive=True):
    attr = _MountAttr(set_flags, 0, 0, 0)
    ret = libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, os.fsencode(path),
                       AT_RECURSIVE if recursive else 0, ctypes.byref(attr),
                       ctypes.c_size_t(ctypes.sizeof(attr)))
    _check(ret, f"mount_setattr {path}")


# --- 1. namespaces ---------------------------------------------------------------------------

def _pass_status_up(pid):
    """Hold nothing, wait for `pid`, and end as it ended (the same exit code or signal)."""
    os.closerange(0, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass  # SIGKILL and SIGSTOP cannot be caught anyway
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is to be ignored
    os._exit(os.waitstatus_to_exitcode(status))


def enter_namespaces(outer_uid, paths, isolation):
    """Fork into new namespaces. Returns, in pid 1 of the new PID namespace, O_PATH descriptors
    of `paths` opened in the new mount namespace while we still had the host uid's right to look
    them up; None (in a plain child) where the kernel refused every namespace."""
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    pid = os.fork()
    if pid:  # the parent: map the child's root to an unprivileged uid of its own, then wait
        os.close(up_w)
        os.close(down_r)
        kind = os.read(up_r, 16)
        answer = b"ok"
        if kind == b"user":
            try:
                uid = gid = outer_uid
                if os.geteuid() != 0:  # without CAP_SETUID only our own ids, setgroups denied
                    uid, gid = os.geteuid(), os.getegid()
                    with open(f"/proc/{pid}/setgroups", "w") as f:
                        f.write("deny")
                for name, outside in (("uid_map", uid), ("gid_map", gid)):
                    with open(f"/proc/{pid}/{name}", "w") as f:
                        f.write(f"0 {outside} 1\n")
            except OSError as exc:
                answer = f"unmapped {_why(exc)}".encode()
        os.write(down_w, answer)
        _pass_status_up(pid)
    os.close(up_r)
    os.close(down_w)
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    kind, why = b"user", ""
    if libc.unshare(flags | CLONE_NEWUSER) != 0:
        why = os.strerror(ctypes.get_errno())
        kind = b"plain" if libc.unshare(flags) == 0 else b"none"
    # A process that is not dumpable has its /proc files owned by root, so a parent without
    # capabilities could not write our id maps. Until it has, and before any untrusted code
    # runs, be dumpable (drop_privileges makes us not dumpable for good).
    mapped_by_us = kind == b"user" and os.geteuid() != 0
    if mapped_by_us:
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    os.write(up_w, kind)
    answer = os.read(down_r, 256)
    os.close(up_w)
    os.close(down_r)
    if mapped_by_us:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if kind == b"none":
        isolation.append(f"no-namespaces ({os.strerror(ctypes.get_errno())})")
        return None
    sources = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in paths}
    if kind == b"user":
        if answer != b"ok":
            raise OSError(1, f"user namespace without an id map ({answer.decode()})")
        os.setresgid(0, 0, 0)
        try:
            os.setgroups([])
        except OSError:
            pass  # setgroups denied (an unprivileged user): we have no supplementary groups
        os.setresuid(0, 0, 0)
        isolation.append("userns")
    else:
        isolation.append(f"no-userns ({why})")
    isolation += ["pidns", "mountns", "netns", "ipcns", "utsns", "cgroupns"]
    _enter_time_namespace(isolation)
    pid = os.fork()
    if pid:
        _pass_status_up(pid)
    return sources


def _enter_time_namespace(isolation):
    """A time namespace for the children to come, its monotonic and boot-time clocks moved back
    to about zero: CLOCK_BOOTTIME, CLOCK_MONOTONIC and a process's start time in /proc then say
    nothing of how long the host has been up. Where the kernel has none (before 5.6), the
    clocks are the host's (isolation says so)."""
    if libc.unshare(CLONE_NEWTIME) != 0:
        isolation.append(f"no-timens ({os.strerror(ctypes.get_errno())})")
        return
    # Not dumpable, our /proc files belong to the host's root, whom a user namespace does not
    # map: be dumpable while we write the offsets (nothing untrusted has run yet).
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        with open("/proc/self/timens_offsets", "w") as f:
            for name, clock in (("monotonic", time.CLOCK_MONOTONIC), ("boottime", time.CLOCK_BOOTTIME)):
                f.write(f"{name} {-int(time.clock_gettime(clock)) + 1} 0\n")
        isolation.append("timens")
    except OSError as exc:
        isolation.append(f"no-timens (offsets: {_why(exc)})")
    finally:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


# --- 2. the filesystem view ------------------------------------------------------------------

def build_root(view, sources, mountpoint, tmp_mb, isolation):
    """Mount the view on a fresh tmpfs at `mountpoint` and make it the root. `sources` maps each
    host path to an O_PATH descriptor opened before we lost the right to look it up."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    root = mountpoint
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    # The private /tmp first: a view folder under /tmp (an interpreter there) is then bound
    # read-only on top of it, rather than hidden by it (or in the way of its mount point).
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={tmp_mb}m,nr_inodes={max(1024, tmp_mb * 256)},mode=1777")
    for kind, path, extra in view:
        dest = root + path
        if kind == "symlink":
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.symlink(extra, dest)
            continue
        if kind == "mask":  # a package folder inside a bound standard library folder: empty
            _mount("tmpfs", dest, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
            continue
        if kind == "dir":
            os.makedirs(dest, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.close(os.open(dest, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(f"/proc/self/fd/{sources[path]}", dest, None, MS_BIND | MS_REC)
        # Devices keep their dev flag (nodev would make them unusable); ro does not stop them.
        _mount_setattr(dest, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | (MOUNT_ATTR_NODEV if kind != "dev" else 0))
    for name in ("dev/fd", "dev/stdin", "dev/stdout", "dev/stderr"):
        target = "/proc/self/fd" + ("" if name == "dev/fd" else f"/{('stdin', 'stdout', 'stderr').index(name[4:])}")
        os.symlink(target, f"{root}/{name}")
    os.makedirs(root + "/proc")
    try:
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        proc = True
    except OSError as exc:  # e.g. a container whose /proc has masked parts
        isolation.append(f"no-proc ({_why(exc)})")
        proc = False
    if proc:
        try:
            _mask_proc(root)
        except OSError as exc:  # rather no /proc than one that shows the host
            _check(libc.umount2(os.fsencode(root + "/proc"), MNT_DETACH), "detach /proc")
            isolation.append(f"no-proc (its host facts could not be masked: {_why(exc)})")
            proc = False
    os.mkdir(root + "/.old")
    _check(libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], os.fsencode(root),
                        os.fsencode(root + "/.old")), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "detach the host's tree")
    os.rmdir("/.old")
    _mount_setattr("/", MOUNT_ATTR_RDONLY, recursive=False)  # the skeleton; /tmp stays writable
    isolation.append(f"minimal-root (tmp {tmp_mb} MiB)")
    return proc


# Entries of a fresh /proc that still describe the host, not the namespaces: its boot id and
# kernel settings (/proc/sys), command line, memory, load, CPU and disk activity, devices,
# interrupts, locks, modules and symbols. Files are covered by /dev/null (read as empty),
# folders by an empty read-only tmpfs. What stays: the process's own entries (/proc/self),
# cpuinfo, version, and what its own namespaces show (net, sysvipc, mounts).
PROC_HOST_FILES = ("cmdline", "meminfo", "loadavg", "stat", "uptime", "diskstats", "partitions",
                   "swaps", "vmstat", "zoneinfo", "buddyinfo", "pagetypeinfo", "slabinfo",
                   "interrupts", "softirqs", "schedstat", "sched_debug", "kallsyms", "modules",
                   "iomem", "ioports", "timer_list", "vmallocinfo", "locks", "devices",
                   "key-users", "keys", "crypto", "misc", "mtrr", "consoles", "cgroups",
                   "kcore", "kmsg", "kpagecount", "kpageflags", "kpagecgroup", "latency_stats",
                   "sysrq-trigger", "config.gz", "filesystems", "execdomains", "fb")
PROC_HOST_DIRS = ("sys", "pressure", "fs", "bus", "driver", "irq", "tty", "acpi", "scsi",
                  "dynamic_debug", "sysvipc")


def _mask_proc(root):
    for name in PROC_HOST_FILES:
        path = f"{root}/proc/{name}"
        if os.path.lexists(path) and not os.path.isdir(path):
            _mount(f"{root}/dev/null", path, None, MS_BIND)
            _mount_setattr(path, MOUNT_ATTR_RDONLY, recursive=False)
    for name in PROC_HOST_DIRS:
        path = f"{root}/proc/{name}"
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")


# --- 3. Landlock -----------------------------------------------------------------------------

class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock(readable, writable, devices, isolation, listable=()):
    """Allow reading under `readable`, everything but devices and exec under `writable`,
    reading and writing `devices`, listing (not reading) under `listable`; nothing else of the
    filesystem, no TCP, no signals out."""
    abi = libc.syscall(SYS_LANDLOCK_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        isolation.append(f"no-landlock ({os.strerror(ctypes.get_errno())})")
        return
    read_file, read_dir, write_file, execute, truncate = 1 << 2, 1 << 3, 1 << 1, 1 << 0, 1 << 14
    make_char, make_block = 1 << 6, 1 << 11
    handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (truncate if abi >= 3 else 0)
    attr = _RulesetAttr(handled, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        isolation.append(f"no-landlock ({os.strerror(ctypes.get_errno())})")
        return
    rules = [(p, read_file | read_dir) for p in readable] + [(p, read_dir) for p in listable]
    rules += [(p, handled & ~(make_char | make_block | execute)) for p in writable]
    rules += [(p, (read_file | write_file | truncate) & handled) for p in devices]
    try:
        for path, allowed in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    allowed &= read_file | write_file | execute | truncate  # file rights only
                rule = _PathBeneath(allowed, fd)
                _check(libc.syscall(SYS_LANDLOCK_ADD, ruleset, 1, ctypes.byref(rule), 0),
                       f"landlock rule {path}")
            finally:
                os.close(fd)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(libc.syscall(SYS_LANDLOCK_RESTRICT, ruleset, 0), "landlock_restrict_self")
        isolation.append(f"landlock (abi {abi})")
    except OSError as exc:
        isolation.append(f"no-landlock ({_why(exc)})")
    finally:
        os.close(ruleset)


# --- 4. capabilities, 5. rlimits -------------------------------------------------------------

def drop_privileges(isolation):
    """Empty the bounding set and every capability set; no_new_privs; not dumpable."""

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
    except (OSError, AttributeError) as exc:
        isolation.append(f"capabilities-kept ({_why(exc)})")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
        isolation.append("not-dumpable")


def set_rlimits(limits, own_uid, isolation):
    cpu = int(limits["cpu_s"])
    pairs = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL at the hard
        (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (limits["open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if own_uid:  # counted per uid: meaningful only where the uid is ours alone (two waiters + us)
        pairs.append((resource.RLIMIT_NPROC, (limits["threads"] + 2,) * 2))
    for which, (soft, hard) in pairs:
        _, inherited = resource.getrlimit(which)
        if inherited != resource.RLIM_INFINITY:  # a limit may only be lowered, never raised
            soft, hard = min(soft, inherited), min(hard, inherited)
        resource.setrlimit(which, (soft, hard))
    isolation.append("rlimits")


# --- 7. the audit hook -----------------------------------------------------------------------

class SandboxViolation(PermissionError):
    """Raised by the audit hook; the first one is also recorded, so catching it does not help."""


def install_audit_hook(tmpdir, violations):
    root = os.path.realpath(tmpdir)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    refused = ("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
               "os.kill", "os.killpg", "subprocess.", "pty.", "signal.pthread_kill",
               "socket.", "ctypes.", "resource.setrlimit", "resource.prlimit",
               "sqlite3.enable_load_extension", "sqlite3.load_extension", "os.startfile",
               "os.add_dll_directory", "webbrowser.open")
    path_args = {"os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,),
                 "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1), "os.symlink": (1,),
                 "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,),
                 "os.lchflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
                 "shutil.rmtree": (0,), "sqlite3.connect": (0,), "shutil.chown": (0,),
                 "tempfile.mkstemp": (0,), "tempfile.mkdtemp": (0,)}
    import threading
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


# --- the whole ---------------------------------------------------------------------------------

def _load_modules(compiled):
    for name, code in compiled.items():
        module = type(sys)(name)
        exec(code, module.__dict__)
        sys.modules[name] = module


def load_pyseccomp(code, libraries, why):
    """Load pyseccomp (the host's copy, compiled) as a module; None, or why it is not loaded
    (`why`: the host's reason for sending no code).

    pyseccomp looks its libraries up with ctypes.util.find_library, which would import
    subprocess and run ldconfig in a child process here. The host has asked already
    (`libraries`: {"c": ..., "seccomp": ...}), so while pyseccomp's top level runs, ctypes.util
    is a stand-in that gives the host's answers; the real entries come back right after."""
    if code is None:
        return why
    import ctypes
    stand_in = type(sys)("ctypes.util")
    stand_in.find_library = lambda name: libraries.get(name)
    saved = sys.modules.get("ctypes.util"), ctypes.__dict__.get("util")
    sys.modules["ctypes.util"] = ctypes.util = stand_in
    module = type(sys)("pyseccomp")
    try:
        exec(code, module.__dict__)
    except Exception as exc:  # e.g. libseccomp.so.2 will not load: the deny-list is the fallback
        return f"pyseccomp failed to load: {type(exc).__name__}: {exc}"
    finally:
        for where, key, value in ((sys.modules, "ctypes.util", saved[0]), (ctypes.__dict__, "util", saved[1])):
            if value is None:
                where.pop(key, None)
            else:
                where[key] = value
    sys.modules["pyseccomp"] = module
    return None


def _send(fd, nonce, **message):
    os.write(fd, (json.dumps(dict(message, nonce=nonce)) + "\n").encode())


def in_pids_cgroup(name):
    """Whether this process is in the run's own cgroup with a pids controller (`name`, made by
    the host before we started; None where it has none). Asked before the cgroup namespace
    hides the path."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if name and path.rstrip("/").endswith("/" + name) and (controllers == "" or "pids" in controllers.split(",")):
            return True
    return False


def confine(config, role, isolation):
    """Apply layers 1-6; returns (the writable folder the code works in, whether its threads
    are counted: by RLIMIT_NPROC in a uid of its own, or by the run's pids cgroup)."""
    view, tmpdir = config["view"], config["tmpdir"]
    counted = in_pids_cgroup(config.get("pids_cgroup"))
    readable = [path for kind, path, _ in view if kind in ("dir", "file")]
    devices = [path for kind, path, _ in view if kind == "dev"]
    paths = [path for kind, path, _ in view if kind in ("dir", "file", "dev")]
    listable = config["listable"]  # the import system lists a folder before importing from it
    sources = enter_namespaces(config["outer_uid"], paths, isolation)
    own_uid = sources is not None and isolation[0] == "userns"
    if sources is not None:
        if build_root(view, sources, tmpdir, config["limits"]["tmp_mb"], isolation):
            readable.append("/proc")
        for fd in sources.values():
            os.close(fd)
        tmpdir = "/tmp"
        os.environ.update(HOME=tmpdir, TMPDIR=tmpdir)
        libc.sethostname(b"sandbox", 7)
    else:  # the host's folder is shared: each process writes (and, under Landlock, reads) its own
        # No view: Landlock alone decides what is readable, the same allow-list (never a
        # package folder or data; the host refused a list that is not tight). Without
        # Landlock, refuse (below). seccomp lets nothing be created in this folder.
        readable = [path for kind, path, _ in config["readable"] if kind in ("dir", "file")]
        tmpdir = os.path.join(tmpdir, role)
        os.mkdir(tmpdir, 0o700)
        os.environ.update(HOME=tmpdir, TMPDIR=tmpdir)
    landlock(readable, [tmpdir], devices, isolation, listable)
    if sources is None and not isolation[-1].startswith("landlock ("):
        raise OSError(1, f"refusing to grade: no filesystem view ({isolation[0]}) and no Landlock "
                         f"({isolation[-1]}): the code could read every file of this user")
    drop_privileges(isolation)
    os.chdir(tmpdir)
    set_rlimits(config["limits"], own_uid, isolation)
    return tmpdir, counted or own_uid


def _keep_only(fds):
    """Close every descriptor above stderr but `fds`."""
    low = 3
    for fd in sorted(set(fds)) + [resource.getrlimit(resource.RLIMIT_NOFILE)[0]]:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1


def play(role, config, secret, channel, isolation):
    """Confine this process for `role`, then play it; never returns."""
    import sandbox_filter
    import sandbox_wire
    status_fd, nonce, tmpdir = config["fds"][role], config["nonce"], config["tmpdir"]
    if config["isolate"]:
        tmpdir, counted = confine(config, role, isolation)
    else:
        os.chdir(tmpdir)
        set_rlimits(config["limits"], False, isolation)
    if config["isolate"]:
        # Threads only where something counts them: otherwise (no uid of its own, no pids
        # cgroup) nothing but the uid's whole RLIMIT_NPROC would, and seccomp refuses clone.
        view = any(layer.startswith("minimal-root") for layer in isolation)
        isolation.append(sandbox_filter.install(libc, os.getpid(), config["seccomp_missing"], view,
                                                threads=counted))
    if role == "candidate":
        violations = []
        if config["audit_hook"]:
            install_audit_hook(tmpdir, violations)
            isolation.append("audit-hook")
        _send(status_fd, nonce, event="ready", isolation=isolation)
        os.close(status_fd)  # before any untrusted code: nothing it writes is a status
        sandbox_wire.run_candidate(config["code"], sandbox_wire.Channel(*channel), violations)
    else:
        _send(status_fd, nonce, event="ready", isolation=isolation)
        outcome, detail, trace = sandbox_wire.run_tests(
            secret["prefix"], secret["tests"], secret["names"], sandbox_wire.Client(*channel))
        _send(status_fd, nonce, event="done", outcome=outcome, detail=detail, traceback=trace)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # os._exit skips atexit handlers and finalizers the untrusted code may have registered.
    os._exit(0)


def main(config):
    """Fork the tests' process and the candidate's, wait for both, and report how the
    candidate's ended (on its status pipe, which by then only we hold)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _load_modules(config.pop("modules"))
    if config["isolate"]:  # before confinement: it loads libseccomp.so.2 from the host's folders
        config["seccomp_missing"] = load_pyseccomp(*config.pop("pyseccomp"))
    fds = config["fds"]
    requests, answers = os.pipe(), os.pipe()
    tests_pid = os.fork()
    if tests_pid == 0:
        _keep_only([fds["tests"], fds["tests_in"], fds["tests_out"], requests[1], answers[0]])
        os.dup2(fds["tests_out"], 1)
        os.dup2(fds["tests_out"], 2)
        with os.fdopen(fds["tests_in"], "rb") as f:  # only this process ever holds it
            secret = json.loads(f.read())
        play("tests", config, secret, (answers[0], requests[1]), [])
    candidate_pid = os.fork()
    if candidate_pid == 0:
        _keep_only([fds["candidate"], requests[0], answers[1]])
        play("candidate", config, None, (requests[0], answers[1]), [])
    _keep_only([fds["candidate"]])
    os.close(1)
    os.close(2)
    returncode = None
    for _ in range(2):
        pid, status = os.wait()
        if pid == candidate_pid:
            returncode = os.waitstatus_to_exitcode(status)
    _send(fds["candidate"], config["nonce"], event="exit", returncode=returncode)
    os._exit(0)

