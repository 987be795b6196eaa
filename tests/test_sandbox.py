"""The sandbox (`suites.sandbox.run_code`): right code passes, wrong code fails, limits hold,
the reasons say why, and the tests' process talks to the candidate's only through plain data.

Attacks on the sandbox through the grading path are in test_sandbox_attacks.py.
"""

import os
import time
from pathlib import Path

import pytest

from suites.sandbox import SandboxLimits, free_names, isolation_available, run_code
from tests.sandbox_modes import REFUSE_UNSHARE, refusing

FAST = SandboxLimits(timeout_s=5.0)


@pytest.fixture(scope="module")
def layers():
    return set(isolation_available())


def test_correct_solution_passes():
    r = run_code("def add(a, b):\n    return a + b\n", "assert add(2, 3) == 5\n", limits=FAST)
    assert r.passed and r.reason == "passed", r
    assert r.returncode == 0


def test_wrong_solution_fails_and_names_the_assertion():
    r = run_code("def add(a, b):\n    return a - b\n", "assert add(2, 3) == 5\n", limits=FAST)
    assert (r.passed, r.reason) == (False, "failed")
    assert "assert add(2, 3) == 5" in r.detail


def test_exception_and_syntax_error_are_errors():
    r = run_code("def f(:\n", "", limits=FAST)
    assert (r.passed, r.reason) == (False, "error") and "SyntaxError" in r.detail
    r = run_code("def f():\n    return 1 / 0\n", "f()\n", limits=FAST)
    assert (r.passed, r.reason) == (False, "error") and "ZeroDivisionError" in r.detail
    assert "<solution> line 2" in r.detail  # where, in the candidate's code


def test_infinite_loop_times_out_within_the_limit():
    start = time.monotonic()
    r = run_code("def f():\n    while True:\n        pass\n", "f()\n", limits=SandboxLimits(timeout_s=1.0))
    assert (r.passed, r.reason) == (False, "timeout")
    assert time.monotonic() - start < 2.5


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock():
    r = run_code("while True:\n    pass\n", "", limits=SandboxLimits(timeout_s=20.0, cpu_s=1))
    assert (r.passed, r.reason) == (False, "cpu"), r
    assert r.duration_s < 10


def test_fork_and_subprocess_are_refused_with_a_reason():
    r = run_code("import os\nwhile True:\n    os.fork()\n", "", limits=FAST)
    assert (r.passed, r.reason) == (False, "forbidden: os.fork")
    r = run_code("import subprocess\nsubprocess.run(['true'])\n", "", limits=FAST)
    assert r.reason.startswith("forbidden: subprocess.Popen"), r.reason
    r = run_code("import os\nos.system('true')\n", "", limits=FAST)
    assert r.reason == "forbidden: os.system"


def test_writing_or_deleting_in_the_view_is_refused_and_catching_it_does_not_help(tmp_path):
    import sys
    victim = os.path.realpath(sys._base_executable)  # inside the read-only view
    r = run_code(f"import os\nos.remove({victim!r})\n", "", limits=FAST)
    assert r.reason.startswith("forbidden: os.remove")
    code = f"try:\n    open({victim + '.new'!r}, 'w')\nexcept Exception:\n    pass\n"
    r = run_code(code, "assert True\n", limits=FAST)
    assert not r.passed and r.reason.startswith("forbidden: open("), r
    assert os.path.exists(victim) and not os.path.exists(victim + ".new")


def test_host_paths_do_not_exist_inside(tmp_path, layers):
    target, keep = tmp_path / "escaped.txt", tmp_path / "keep.txt"
    keep.write_text("precious")
    for code in (f"open({str(target)!r}, 'w').write('x')\n", f"import os\nos.remove({str(keep)!r})\n",
                 f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n"):
        r = run_code(code, "", limits=FAST)
        # Without namespaces (an unprivileged container) the host's paths exist but are refused.
        refused = "FileNotFoundError" if any(x.startswith("minimal-root") for x in layers) else "forbidden: "
        assert not r.passed and refused in r.detail + r.reason, r
    assert not target.exists() and keep.read_text() == "precious"


def test_the_private_tmp_is_writable_and_the_tests_see_it_through_the_candidate(layers):
    code = ("import os, tempfile\n"
            "open('scratch.txt', 'w').write('ok')\n"
            "os.mkdir('sub'); os.rename('scratch.txt', 'sub/x.txt')\n"
            "with tempfile.NamedTemporaryFile() as f:\n    f.write(b'1')\n"
            "def read():\n    return open('sub/x.txt').read()\n")
    r = run_code(code, "assert read() == 'ok'\nimport os\nassert not os.path.exists('sub')\n", limits=FAST)
    if any(x.startswith("minimal-root") for x in layers):
        assert r.passed, r  # the tests' own folder is another one
    else:  # no capped tmpfs without namespaces: the run creates nothing on the host's disk
        assert not r.passed and "Operation not permitted: 'scratch.txt'" in r.reason, r


def test_allocating_past_the_memory_cap_is_stopped():
    limits = SandboxLimits(timeout_s=10.0, memory_mb=256)
    r = run_code("x = bytearray(1024 * 1024 * 1024)\n", "", limits=limits)
    assert (r.passed, r.reason) == (False, "memory"), r
    assert "256 MiB" in r.detail


def test_file_size_limit(layers):
    limits = SandboxLimits(timeout_s=10.0, file_size_mb=1)
    r = run_code("open('big.bin', 'wb').write(b'x' * (2 << 20))\n", "", limits=limits)
    if any(x.startswith("minimal-root") for x in layers):
        assert (r.passed, r.reason) == (False, "file_size"), r
    else:  # without the view's capped tmpfs the run creates no file at all
        assert not r.passed and r.reason.startswith("forbidden: PermissionError"), r


def test_output_is_capped():
    limits = SandboxLimits(timeout_s=10.0, max_output_bytes=1000)
    r = run_code("print('x' * 1_000_000)\n", "", limits=limits)
    assert r.passed and r.truncated
    assert len(r.stdout) == 1000


def test_early_exit_is_not_a_pass():
    r = run_code("import os\nos._exit(0)\n", "assert False\n", limits=FAST)
    assert not r.passed and r.reason == "error" and "before the tests finished" in r.detail, r
    r = run_code("import sys\nsys.exit(0)\n", "assert False\n", limits=FAST)
    assert not r.passed and "SystemExit" in r.detail


def test_stdout_and_main_guard():
    code = "print('hello')\nif __name__ == '__main__':\n    raise SystemExit(1)\n"
    r = run_code(code, "", limits=FAST)
    assert r.passed and r.stdout == "hello\n"


# --- two processes, one channel of plain data ------------------------------------------------

def test_the_tests_run_in_another_interpreter():
    code = "import builtins, os\nbuiltins.MARK = os.getpid()\ndef mark():\n    return builtins.MARK\n"
    tests = "import builtins, os\nassert not hasattr(builtins, 'MARK')\nassert isinstance(mark(), int)\n"
    assert run_code(code, tests, limits=FAST).passed


def test_objects_classes_exceptions_and_generators_cross_as_handles():
    code = ("class Stack:\n    def __init__(self):\n        self.items = []\n"
            "    def push(self, x):\n        self.items.append(x)\n"
            "    def pop(self):\n        if not self.items:\n            raise IndexError('empty')\n"
            "        return self.items.pop()\n    def __len__(self):\n        return len(self.items)\n"
            "def count(n, *, step=1):\n    yield from range(0, n, step)\n")
    tests = ("s = Stack()\ns.push(1)\ns.push((2, {'a': {3}}))\nassert len(s) == 2\n"
             "assert s.pop() == (2, {'a': {3}})\nassert s.items == [1]\ns.pop()\n"
             "try:\n    s.pop()\nexcept IndexError as e:\n    assert 'empty' in str(e)\n"
             "else:\n    raise AssertionError('no IndexError')\n"
             "assert list(count(7, step=3)) == [0, 3, 6]\nassert s == s and s != Stack()\n")
    r = run_code(code, tests, limits=FAST)
    assert r.passed, r


def test_plain_values_round_trip_exactly():
    code = "def echo(x):\n    return x\n"
    tests = ("for v in (None, True, 0, -1, 2**200, -2**70, 1.5, float('inf'), 'é\\n', b'\\x00\\xff',\n"
             "          1+2j, [1, [2]], (1, (2,)), {1: 'a', (2, 3): [4]}, {1, 2}, frozenset({3})):\n"
             "    out = echo(v)\n    assert out == v and type(out) is type(v), (v, out)\n"
             "assert echo(float('nan')) != echo(float('nan'))\n")
    assert run_code(code, tests, limits=FAST).passed


def test_arguments_pass_by_value_and_functions_do_not_cross():
    code = "def grow(xs):\n    xs.append(1)\n    return len(xs)\ndef call(f):\n    return f(1)\n"
    tests = ("xs = []\nassert grow(xs) == 1 and xs == []\n"
             "try:\n    call(lambda v: v)\nexcept TypeError as e:\n    assert 'plain data' in str(e)\n"
             "else:\n    raise AssertionError('a function crossed')\n")
    assert run_code(code, tests, limits=FAST).passed


def test_free_names_are_what_the_tests_take_from_the_candidate():
    tests = "import math\ns = Stack()\ndef check(c):\n    assert c(helper(1)) == math.pi\ncheck(f)\n"
    assert free_names(tests) == ("Stack", "f", "helper")
    assert free_names(tests, prefix="def helper(x):\n    return x\n") == ("Stack", "f")
    assert free_names("def broken(:\n") == ()
    r = run_code("x = 1\n", "assert missing() == 1\n", limits=FAST)
    assert r.reason == "error" and "NameError" in r.detail


# --- the kernel layers ------------------------------------------------------------------------

def _need(layers, *any_of):
    """Skip only where the kernel gives none of `any_of` ("seccomp" matches "seccomp (...)")."""
    if not any(l == a or l.startswith(a + " (") for l in layers for a in any_of):
        pytest.skip(f"the kernel here allows none of {any_of}: {sorted(layers)}")


def test_layers_applied_as_root(layers):
    assert {"rlimits", "audit-hook"} <= layers
    if os.geteuid() == 0:  # root can always create namespaces and install seccomp filters
        want = {"pidns", "mountns", "netns", "ipcns", "no-capabilities", "not-dumpable"}
        assert want <= layers, layers
        assert any(layer.startswith("minimal-root") for layer in layers), layers
        assert any(layer.startswith("seccomp (") for layer in layers), layers


CAPABILITIES = """
def status():
    lines = open("/proc/self/status").read().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines) if k.startswith("Cap") or k == "NoNewPrivs"}
"""
NO_CAPABILITIES = """
for s in (status(), {k: v.strip() for k, v in (line.split(":", 1) for line in open("/proc/self/status").read().splitlines())}):
    assert [s[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")] == ["0000000000000000"] * 5, s
    assert s["NoNewPrivs"] == "1", s
"""


def test_no_capabilities_are_held_where_the_layer_is_reported(layers):
    """Both processes, as the kernel sees them: every capability set empty (root inside a user
    namespace otherwise holds a full set there) and no_new_privs, not only the layer's name."""
    _need(layers, "no-capabilities")
    if os.geteuid() != 0 and any(x.startswith("no-namespaces") for x in layers):
        # As an ordinary user with no namespace there is no capability to hold, and the sandbox's
        # not-dumpable process cannot read its own /proc/self/status (root owns it) to show it.
        pytest.skip("an unprivileged user without namespaces: no capability to drop, none to read")
    r = run_code(CAPABILITIES, NO_CAPABILITIES, limits=FAST, audit_hook=False)
    assert r.passed, r


def test_nothing_of_the_host_is_left_under_the_view(layers):
    """pivot_root leaves the host's tree at /.old until it is detached: the view is only what the
    allow-list names (Landlock would still refuse reads there; this is the view's own check)."""
    _need(layers, "minimal-root")
    host = [os.path.dirname(os.path.abspath(__file__)), "/.old"]
    r = run_code("import os\ndef seen(paths):\n    return [p for p in paths if os.path.lexists(p)]\n",
                 f"assert seen({host!r}) == []\n", limits=FAST, audit_hook=False)
    assert r.passed, r


def test_backstop_without_audit_hook(layers):
    _need(layers, "seccomp")
    for code in ("import os\nwhile True:\n    os.fork()\n", "import socket\nsocket.socket()\n"):
        r = run_code(code, "", limits=FAST, audit_hook=False)
        assert not r.passed and r.reason.startswith("forbidden: PermissionError"), r


def test_backstop_write_without_audit_hook(layers):
    _need(layers, "mountns", *(x for x in layers if x.startswith("landlock (")))
    import sys
    target = os.path.realpath(sys._base_executable) + ".escaped"
    r = run_code(f"open({target!r}, 'w').write('x')\n", "", limits=FAST, audit_hook=False)
    assert not r.passed and r.reason.startswith("forbidden: "), r
    assert not os.path.exists(target)


def test_network_namespace_has_only_loopback(layers):
    """With a network namespace only `lo` exists; without one (no namespaces at all) seccomp
    refuses every socket, so the host's network is as out of reach."""
    if "netns" not in layers:
        r = run_code("import socket\nsocket.socket()\n", "", limits=FAST, audit_hook=False)
        assert not r.passed and r.reason.startswith("forbidden: PermissionError"), r
        return
    code = ("lines = open('/proc/self/net/dev').read().splitlines()[2:]\n"
            "names = sorted(line.split(':')[0].strip() for line in lines)\n"
            "def interfaces():\n    return names\n")
    r = run_code(code, "assert interfaces() == ['lo'], interfaces()\n", limits=FAST)
    assert r.passed, r


def test_timeout_kills_the_whole_process_group():
    if os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC blocks fork for non-root users, so there is no group to kill")
    # Without isolation and hook a forked grandchild survives unless the group is killed.
    code = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n"
            "    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(60)\n")
    r = run_code(code, "", limits=SandboxLimits(timeout_s=1.0), isolate=False, audit_hook=False)
    assert r.reason == "timeout"
    grandchild = int(r.stdout.split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        status = Path(f"/proc/{grandchild}/status")
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} still alive after the timeout")


NO_NAMESPACES = REFUSE_UNSHARE + """
import json, sys
from suites.sandbox import run_code
secret = sys.argv[1]
read = run_code(f"def leak():\\n    return open({secret!r}).read()\\n", "assert leak() == 'x'\\n")
right = run_code("def add(a, b):\\n    return a + b\\n", "assert add(2, 3) == 5\\n")
# The standard library stays importable after the import system's caches are dropped.
fresh = run_code("import importlib\\nimportlib.invalidate_caches()\\nimport fractions\\n"
                 "def third():\\n    return str(fractions.Fraction(1, 3))\\n", "assert third() == '1/3'\\n")
wrong = run_code("def add(a, b):\\n    return 5\\n", "assert add(2, 3) == 5\\nassert add(1, 1) == 2\\n")
# Without a capped tmpfs the run creates nothing on the host's disk: not even a file to plant.
planted = run_code("open('planted.py', 'w').write('x')\\ndef f():\\n    return 1\\n",
                   "import os\\nassert f() == 1 and not os.path.exists('planted.py'), os.listdir()\\n")
print(json.dumps({"isolation": read.isolation, "read": read.detail,
                  "passed": [right.passed, wrong.passed, planted.passed, fresh.passed], "planted": planted.detail}))
"""


def test_where_the_kernel_refuses_namespaces_landlock_keeps_host_files_out(tmp_path, layers):
    _need(layers, *(x for x in layers if x.startswith("landlock (")))
    import json
    import subprocess
    import sys
    secret = tmp_path / "token"
    secret.write_text("SECRET-fallback")
    out = subprocess.run([sys.executable, "-c", NO_NAMESPACES, str(secret)], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert any(x.startswith("no-namespaces") for x in got["isolation"]), got
    assert any(x.startswith("landlock") for x in got["isolation"])
    assert any(x.startswith("seccomp (") for x in got["isolation"]), got
    assert "SECRET" not in got["read"] and "Permission denied" in got["read"], got
    assert got["passed"] == [True, False, False, True], got
    assert "Operation not permitted: 'planted.py'" in got["planted"], got


REFUSED = """
import json, sys
from suites.sandbox import parent, run_code
if sys.argv[1] == "loose":  # a layout where a package folder would be in the view
    entries, folders, _ = parent._view()
    parent._view = lambda: (entries, folders, "/site-packages would be readable (the view holds /)")
r = run_code("def f():\\n    return 1\\n", "assert f() == 1\\n")
print(json.dumps([r.passed, r.reason, r.detail]))
"""


@pytest.mark.parametrize("missing", ["loose", "loose-no-namespaces", "landlock"])
def test_a_loose_view_or_a_missing_landlock_refuses_to_grade(missing):
    """Where the allow-list cannot make the view tight (with or without namespaces: the same
    list), or without namespaces Landlock is missing, the sandbox refuses in one line, naming
    why, rather than grade."""
    import json
    import subprocess
    import sys
    setup = {"loose": "", "loose-no-namespaces": refusing("unshare"),
             "landlock": refusing("unshare", "landlock_create_ruleset")}[missing]
    out = subprocess.run([sys.executable, "-c", setup + REFUSED, missing.split("-")[0]], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    passed, reason, detail = json.loads(out.stdout.strip().splitlines()[-1])
    assert not passed and reason.startswith("sandbox error"), (reason, detail)
    assert "\n" not in detail, detail
    if missing == "landlock":
        assert "refusing to grade: no filesystem view" in detail and "and no Landlock (no-landlock" in detail, detail
    else:
        assert detail.startswith("refusing to grade: the allow-list cannot make the view tight: "
                                 "/site-packages would be readable"), detail
