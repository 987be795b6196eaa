"""The sandbox's own tests again, as an unprivileged user: uid 65534 with no capabilities at all
(the bounding set empty too), as a CI container often runs them.

Two kinds of machine:
- "userns": the kernel lets that user create user namespaces (this one does), so every layer
  but the cgroup applies: the host's cgroup folders are root's.
- "no-userns": creating a user namespace is refused with EPERM (Docker's default seccomp profile
  refuses unshare, kernel.unprivileged_userns_clone=0 refuses CLONE_NEWUSER). A filter on the
  whole test run refuses unshare and clone with CLONE_NEWUSER, and clone3 (ENOSYS: glibc falls
  back on clone). The sandbox then gets no namespaces at all and rests on Landlock, seccomp, the
  dropped capabilities and the rlimits.

Each runs tests/test_sandbox_attacks.py, tests/test_sandbox.py and tests/test_sandbox_seccomp.py
in a pytest of its own. No test may fail, and the attack tests that are skipped must be exactly
the ones whose every stopping layer is missing there. The tests drop privileges themselves, so
they run as root (as on CI): in a private mount namespace (`unshare --mount`), folders on the
way to the interpreter that the user could not enter (/root, for a pyenv Python) are covered
with a tmpfs that holds only the interpreter's folder; then `setpriv` drops to uid 65534.
"""

import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = ["tests/test_sandbox_attacks.py", "tests/test_sandbox.py", "tests/test_sandbox_seccomp.py",
         "tests/test_sandbox_layouts.py"]
# The system interpreter's layout plants its data under /usr in a private mount namespace: root only.
SYSTEM_LAYOUT = {f"test_sandbox_layouts.py::test_the_humaneval_cheat_fails_in_every_layout[system-{mode}]"
                 for mode in ("namespaces", "view-only", "no-namespaces", "control")}
NOBODY = 65534
# Each reruns three test files as another user (~1-3 min): the full tier (make test).
pytestmark = pytest.mark.full



def _closed(path):
    """The first folder on the way to `path` that others may not enter, and the next step in it
    (None if the whole way is open)."""
    parts = os.path.realpath(path).strip("/").split("/")
    for i in range(len(parts)):
        folder = "/" + "/".join(parts[:i])
        if not os.stat(folder).st_mode & 0o001:
            return folder, parts[i]
    return None


# Runs as root in the private mount namespace: make the paths in argv[1] (JSON) reachable by
# others, then exec argv[2:]. A closed folder is covered by a tmpfs that holds only the steps
# needed through it, each bind-mounted back from the original.
EXPOSE = "import json, os, subprocess, sys, tempfile\n" + inspect.getsource(_closed) + r"""
for _ in range(8):
    blocked = {}
    for path in json.loads(sys.argv[1]):
        found = _closed(path)
        if found:
            blocked.setdefault(found[0], set()).add(found[1])
    if not blocked:
        break
    for folder, children in blocked.items():
        staging = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        for child in children:  # hold the child, cover the folder, put the child back
            os.mkdir(os.path.join(staging, child))
            subprocess.run(["mount", "--bind", os.path.join(folder, child), os.path.join(staging, child)], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "tmpfs", folder], check=True)
        for child in children:
            os.mkdir(os.path.join(folder, child))
            subprocess.run(["mount", "--move", os.path.join(staging, child), os.path.join(folder, child)], check=True)
            os.rmdir(os.path.join(staging, child))
        os.rmdir(staging)
os.execvp(sys.argv[2], sys.argv[2:])
"""

# Runs as the unprivileged user: with argv[1] == "no-userns", refuse new user namespaces for
# everything below; print who we are and the sandbox's layers; exec argv[2:].
CONTAIN = r"""
import errno, json, os, sys
if sys.argv[1] == "no-userns":
    import pyseccomp as s
    f = s.SyscallFilter(s.ALLOW)
    for name in ("unshare", "clone"):
        f.add_rule(s.ERRNO(errno.EPERM), name, s.Arg(0, s.MASKED_EQ, 0x10000000, 0x10000000))
    f.add_rule(s.ERRNO(errno.ENOSYS), "clone3")
    f.load()
from suites.sandbox import isolation_available
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
print(json.dumps({"uid": os.getuid(), "caps": [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")],
                  "layers": isolation_available()}), flush=True)
os.execv(sys.argv[2], sys.argv[2:])
"""

# The tests skipped there, each because every layer its check relies on is missing:
EXPECTED_SKIPS = {
    "userns": {"test_sandbox.py::test_timeout_kills_the_whole_process_group", *SYSTEM_LAYOUT},  # root only
    "no-userns": {
        "test_sandbox.py::test_timeout_kills_the_whole_process_group", *SYSTEM_LAYOUT,  # root only
        # No namespaces, so no time namespace: the vDSO reads the host's clocks (README).
        "test_sandbox_attacks.py::test_the_hosts_uptime_is_hidden",
        # Landlock refused on top of no namespaces: no view and no Landlock, the sandbox refuses.
        *(f"test_sandbox_layouts.py::test_the_humaneval_cheat_fails_in_every_layout[{layout}-view-only]"
          for layout in ("pyenv-virtualenv", "conda", "checkout", "zipped")),
        "test_sandbox_attacks.py::test_a_correct_program_passes_with_one_layer[view-only]",
        # No view to look under; and no capability an ordinary user could hold, none it could read
        # from its not-dumpable /proc/self/status.
        "test_sandbox.py::test_nothing_of_the_host_is_left_under_the_view",
        "test_sandbox.py::test_no_capabilities_are_held_where_the_layer_is_reported",
    },
}


def _launcher(python, reach):
    """The command that runs the rest as root in a private mount namespace where `reach` is open
    to others ([] where it already is); skips where that cannot be had."""
    if os.geteuid() != 0:
        pytest.skip("dropping privileges needs root (CI runs the tests as root)")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing")
    if not any(_closed(path) for path in reach):
        return []
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0 or shutil.which("mount") is None:
        closed = [_closed(path) for path in reach if _closed(path)]
        pytest.skip(f"{closed} are closed to uid {NOBODY} and no private mount namespace can "
                    f"open them: {probe.stderr.strip() if probe else 'no unshare'}")
    return ["unshare", "--mount", "--propagation", "private", "--", python, "-c", EXPOSE, json.dumps(reach)]


@pytest.mark.parametrize("kind", ["userns", "no-userns"])
def test_the_sandbox_tests_pass_as_an_unprivileged_user(kind):
    python = os.path.join(sys.prefix, "bin", "python")
    launcher = _launcher(python, [os.path.realpath(sys.base_prefix), sys.prefix, str(REPO)])
    work = tempfile.mkdtemp(prefix="decodegate-unprivileged-")
    os.chmod(work, 0o777)  # the user's HOME and pytest's basetemp
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work, "HF_HUB_OFFLINE": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
    command = [*launcher,
               "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
               "--inh-caps=-all", "--bounding-set=-all", "--",
               python, "-c", CONTAIN, kind,
               python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-o", "addopts=",
               f"--basetemp={work}/basetemp", f"--junitxml={work}/junit.xml", *FILES]
    try:
        out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
        skipped = _skipped(Path(work, "junit.xml")) if out.returncode == 0 else {}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = out.stdout.splitlines()
    assert lines and lines[0].startswith("{"), out.stdout[-3000:] + out.stderr[-3000:]
    who = json.loads(lines[0])
    assert who["uid"] == NOBODY and who["caps"] == ["0000000000000000"] * 3, who
    layers = who["layers"]
    print(kind, "layers:", layers, "\n" + "\n".join(lines[-3:]))
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    if kind == "userns" and layers[0].startswith("no-namespaces"):
        pytest.skip(f"this kernel refuses user namespaces to uid {NOBODY}; the tests passed "
                    f"without them: {layers}")
    assert any(x.startswith("seccomp (allow-list") for x in layers), layers
    assert any(x.startswith("landlock (") for x in layers) and "no-capabilities" in layers, layers
    if kind == "userns":
        assert {"userns", "pidns", "mountns", "netns", "ipcns"} <= set(layers), layers
    else:
        assert layers[0].startswith("no-namespaces (Operation not permitted)"), layers
    assert set(skipped) == EXPECTED_SKIPS[kind], skipped


def _skipped(junit: Path) -> dict:
    """{file::test[param]: why} of the tests the inner run skipped."""
    import xml.etree.ElementTree as ET
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        skip = case.find("skipped")
        if skip is not None:
            file = case.get("classname").rsplit(".", 1)[-1] + ".py"
            found[f"{file}::{case.get('name')}"] = skip.get("message", "")
    return found
