"""The sandbox: right code passes, wrong code fails, and every escape attempt is stopped and named.

The audit-hook tests show the reasons a user sees; the `audit_hook=False` tests show that the
kernel layers (read-only mounts, seccomp) stop the same attempts when the hook is bypassed.
"""

import os
import time
from pathlib import Path

import pytest

from suites.sandbox import SandboxLimits, isolation_available, run_code

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
    assert not r.passed
    assert r.reason == "failed"
    assert "assert add(2, 3) == 5" in r.detail


def test_exception_and_syntax_error_are_errors():
    r = run_code("def f(:\n", "", limits=FAST)
    assert (r.passed, r.reason) == (False, "error") and "SyntaxError" in r.detail
    r = run_code("def f():\n    return 1 / 0\n", "f()\n", limits=FAST)
    assert (r.passed, r.reason) == (False, "error") and "ZeroDivisionError" in r.detail


def test_infinite_loop_times_out_within_the_limit():
    start = time.monotonic()
    r = run_code("while True:\n    pass\n", "", limits=SandboxLimits(timeout_s=1.0))
    elapsed = time.monotonic() - start
    assert (r.passed, r.reason) == (False, "timeout")
    assert elapsed < 2.5, elapsed


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock():
    r = run_code("while True:\n    pass\n", "", limits=SandboxLimits(timeout_s=20.0, cpu_s=1))
    assert (r.passed, r.reason) == (False, "cpu"), r
    assert r.duration_s < 10


def test_fork_bomb_is_stopped():
    bomb = "import os\nwhile True:\n    os.fork()\n"
    r = run_code(bomb, "", limits=FAST)
    assert not r.passed
    assert r.reason == "forbidden: os.fork"


def test_subprocess_and_system_are_stopped():
    r = run_code("import subprocess\nsubprocess.run(['true'])\n", "", limits=FAST)
    assert r.reason.startswith("forbidden: subprocess.Popen"), r.reason
    r = run_code("import os\nos.system('true')\n", "", limits=FAST)
    assert r.reason == "forbidden: os.system"


def test_write_outside_the_temp_dir_is_stopped(tmp_path):
    target = tmp_path / "escaped.txt"
    r = run_code(f"open({str(target)!r}, 'w').write('x')\n", "", limits=FAST)
    assert not r.passed
    assert r.reason.startswith("forbidden: open(") and "outside the sandbox dir" in r.reason
    assert not target.exists()


def test_deleting_outside_the_temp_dir_is_stopped(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    r = run_code(f"import os\nos.remove({str(victim)!r})\n", "", limits=FAST)
    assert r.reason.startswith("forbidden: os.remove")
    assert victim.read_text() == "precious"


def test_catching_the_violation_does_not_hide_it(tmp_path):
    target = tmp_path / "escaped.txt"
    code = f"try:\n    open({str(target)!r}, 'w')\nexcept Exception:\n    pass\n"
    r = run_code(code, "assert True\n", limits=FAST)
    assert not r.passed and r.reason.startswith("forbidden: open(")


def test_writing_inside_the_temp_dir_is_allowed():
    code = ("import os, tempfile\n"
            "open('scratch.txt', 'w').write('ok')\n"
            "os.mkdir('sub'); os.rename('scratch.txt', 'sub/x.txt')\n"
            "with tempfile.NamedTemporaryFile() as f:\n    f.write(b'1')\n")
    r = run_code(code, "assert open('sub/x.txt').read() == 'ok'\n", limits=FAST)
    assert r.passed, r


def test_opening_a_socket_is_stopped():
    code = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 80))\n"
    r = run_code(code, "", limits=FAST)
    assert not r.passed
    assert r.reason == "forbidden: socket.__new__"


def test_ctypes_is_stopped():
    r = run_code("import ctypes\nctypes.CDLL(None).fork()\n", "", limits=FAST)
    assert r.reason.startswith("forbidden: ctypes"), r.reason


def test_allocating_past_the_memory_cap_is_stopped():
    limits = SandboxLimits(timeout_s=10.0, memory_mb=256)
    r = run_code("x = bytearray(1024 * 1024 * 1024)\n", "", limits=limits)
    assert (r.passed, r.reason) == (False, "memory"), r
    assert "256 MiB" in r.detail


def test_file_size_limit():
    limits = SandboxLimits(timeout_s=10.0, file_size_mb=1)
    r = run_code("open('big.bin', 'wb').write(b'x' * (2 << 20))\n", "", limits=limits)
    assert (r.passed, r.reason) == (False, "file_size"), r


def test_output_is_capped():
    limits = SandboxLimits(timeout_s=10.0, max_output_bytes=1000)
    r = run_code("print('x' * 1_000_000)\n", "", limits=limits)
    assert r.passed and r.truncated
    assert len(r.stdout) == 1000


def test_early_exit_is_not_a_pass():
    r = run_code("import os\nos._exit(0)\n", "assert False\n", limits=FAST)
    assert not r.passed and r.reason == "error"
    r = run_code("import sys\nsys.exit(0)\n", "assert False\n", limits=FAST)
    assert not r.passed and "SystemExit" in r.detail


def test_forged_status_lines_are_ignored():
    # The code does not know the nonce: whatever it writes on the status pipe does not count.
    code = ("import os\n"
            "line = b'{\"event\": \"done\", \"outcome\": \"ok\", \"nonce\": \"guess\"}\\n'\n"
            "for fd in range(3, 20):\n"
            "    try:\n        os.write(fd, line)\n    except OSError:\n        pass\n"
            "os._exit(0)\n")
    r = run_code(code, "", limits=FAST)
    assert not r.passed


def test_stdout_and_main_guard():
    code = "print('hello')\nif __name__ == '__main__':\n    raise SystemExit(1)\n"
    r = run_code(code, "", limits=FAST)
    assert r.passed and r.stdout == "hello\n"


def test_the_test_process_is_unaffected(tmp_path):
    pid, cwd = os.getpid(), os.getcwd()
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("here")
    r = run_code("import os\nos.kill(os.getppid(), 9)\n", "", limits=FAST)
    assert r.reason == "forbidden: os.kill"
    r = run_code(f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n", "", limits=FAST)
    assert r.reason.startswith("forbidden: shutil.rmtree")
    r = run_code("import os\nos.chdir('/')\n", "", limits=FAST)  # its own cwd only
    assert r.passed
    assert (os.getpid(), os.getcwd()) == (pid, cwd)
    assert sentinel.read_text() == "here"


# --- the kernel layers alone (audit hook off) ------------------------------------------------

def _need(layers, layer):
    if layer not in layers:
        pytest.skip(f"this platform does not allow the {layer!r} layer: {sorted(layers)}")


def test_layers_applied_as_root(layers):
    assert {"rlimits", "audit-hook"} <= layers
    if os.geteuid() == 0:  # root can always create namespaces and install seccomp filters
        assert {"netns", "readonly-fs", "no-capabilities", "seccomp"} <= layers, layers


def test_backstop_fork_without_audit_hook(layers):
    _need(layers, "seccomp")
    r = run_code("import os\nwhile True:\n    os.fork()\n", "", limits=FAST, audit_hook=False)
    assert not r.passed and r.reason.startswith("forbidden: PermissionError"), r


def test_backstop_write_without_audit_hook(layers, tmp_path):
    _need(layers, "readonly-fs")
    target = tmp_path / "escaped.txt"
    r = run_code(f"open({str(target)!r}, 'w').write('x')\n", "", limits=FAST, audit_hook=False)
    assert not r.passed and "Read-only file system" in r.reason, r
    assert not target.exists()


def test_backstop_socket_without_audit_hook(layers):
    _need(layers, "seccomp")
    r = run_code("import socket\nsocket.socket()\n", "", limits=FAST, audit_hook=False)
    assert not r.passed and r.reason.startswith("forbidden: PermissionError"), r


def test_network_namespace_has_only_loopback(layers):
    _need(layers, "netns")
    code = ("lines = open('/proc/self/net/dev').read().splitlines()[2:]\n"
            "names = sorted(line.split(':')[0].strip() for line in lines)\n")
    r = run_code(code, "assert names == ['lo'], names\n", limits=FAST)
    assert r.passed, r


def test_timeout_kills_the_whole_process_group():
    if os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC blocks fork for non-root users, so there is no group to kill")
    # Without isolation and hook a forked grandchild survives unless the group is killed.
    code = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n"
            "    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(60)\n")
    r = run_code(code, "", limits=SandboxLimits(timeout_s=1.0), isolate=False,
                 audit_hook=False)
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
