"""Hostile attacks on the worker boundary and the exit code (issue 57, review 57a).

Each test is a decoder (or a hand-made run folder) that tries to make `regress` exit 0 without a
complete passing verdict, pass a broken candidate, or die with exit 3 / hang because of a decoder.
The decoder module `attack.py` is written into tmp_path; `attack` and `at` options pick what it
does on which call of generate_many.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.run.records import PLAN

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ATTACK = '''\
import dataclasses
import gc
import os
import signal
import time

from decoders.standard import StandardDecoder


def pipe():
    """The worker's end of the pipe to the parent, as a decoder finds it."""
    import sys
    f = sys._getframe()
    while f is not None and "conn" not in f.f_locals:  # gc.get_objects() misses it: the worker froze the GC
        f = f.f_back
    return f.f_locals["conn"]


def writable(attack, run_dir):
    """The run folder where the decoder may write it, for each way round the read-only mount."""
    import ctypes
    if attack == "unmount-then-erase-stops":  # root in the mount namespace: drop the read-only bind
        ctypes.CDLL(None).umount2(run_dir.encode(), 2)  # MNT_DETACH
    if attack == "remount-then-erase-stops":  # or make it writable again
        ctypes.CDLL(None).mount(None, run_dir.encode(), None, 4096 | 32, None)  # MS_BIND | MS_REMOUNT
    if attack == "proc-root-erase-stops":  # the host's /proc: a process in the host's mount namespace
        pid, mine = int(os.readlink("/proc/self")), os.readlink("/proc/self/ns/mnt")
        while pid > 1:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            try:
                if os.readlink(f"/proc/{pid}/ns/mnt") != mine:
                    return f"/proc/{pid}/root{run_dir}"
            except OSError:
                pass
    return run_dir


class Evil:
    """Unpickled in the parent: any callable with any arguments runs there."""
    def __reduce__(self):
        return (exec, ("import harness.verdict.exit_code as m; m.exit_code = lambda d: (0, '')",))


class Attack(StandardDecoder):
    def __init__(self, target, attack="none", at=0, **options):
        if attack == "hang-on-load":
            time.sleep(10 ** 6)
        if attack.endswith("-erase-stops"):
            # The decoder runs as the user who owns the run folder (a real one finds it in
            # /proc/<ppid>/cmdline): on the rerun its load empties the ledger of deaths.
            stops = os.path.join(writable(attack, os.environ["ATTACK_RUN_DIR"]), "stops.jsonl")
            if os.path.exists(stops):
                open(stops, "w").close()
        super().__init__(target, **options)
        self.attack, self.at, self.calls = attack, at, 0

    def generate_many(self, requests):
        self.calls += 1
        if self.calls != self.at:
            yield from super().generate_many(requests)
            return
        a = self.attack
        result = self.generate(requests[0])
        if a.endswith("-erase-stops"):
            mark = os.path.join(os.path.dirname(__file__), a + ".done")
            if not os.path.exists(mark):
                open(mark, "w").close()
                raise RuntimeError("broken on its second item")
        if a == "huge":
            result = dataclasses.replace(result, stats={**result.stats, "blob": "x" * (3 * 2 ** 20)})
        if a == "hang":
            time.sleep(10 ** 6)
        if a == "orphan":  # a pool, a tokenizer's helper, a server the decoder started: outlives its worker
            # Its name, not its pid, says which it is: a pid in the worker's namespace names another
            # process (or none) outside it.
            name = f"dg-orphan-{os.urandom(2).hex()}"
            with open(os.path.join(os.path.dirname(__file__), "orphan.name"), "w") as f:
                f.write(name)
            if os.fork() == 0:
                import ctypes
                ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
                time.sleep(600)
                os._exit(0)
            time.sleep(0.5)  # its name set
            raise RuntimeError("broken, with a child of its own")
        if a == "pickle":
            pipe().send(("result", 0, Evil()))
            raise RuntimeError("broken")
        if a == "not-a-tuple":
            pipe().send(42)
            raise RuntimeError("broken")
        if a == "not-json":
            pipe().send(("result", 0, "{not json"))
            raise RuntimeError("broken")
        if a == "short-message":
            pipe().send(("result",))
            raise RuntimeError("broken")
        if a in ("kill-parent", "stop-parent", "term-parent"):
            mark = os.path.join(os.path.dirname(__file__), a + ".done")
            if not os.path.exists(mark):  # once: the rerun goes through (a fault that struck once)
                open(mark, "w").close()
                sig = {"kill-parent": signal.SIGKILL, "stop-parent": signal.SIGSTOP, "term-parent": signal.SIGTERM}[a]
                os.kill(os.getppid(), sig)
                time.sleep(60)
        if a == "plant":  # decodegate's code and the packages it imports later, in the parent
            import harness, torch
            planted = {}
            for d in (os.path.dirname(os.path.dirname(harness.__file__)), os.path.dirname(os.path.dirname(torch.__file__))):
                path = os.path.join(d, f"_planted_{os.getpid()}_{os.urandom(4).hex()}.py")
                try:
                    with open(path, "w") as f:
                        f.write("raise SystemExit(0)")
                    planted[path] = "written"
                except OSError as e:
                    planted[path] = e.strerror
            result = dataclasses.replace(result, stats={**result.stats, "planted": planted})
        if a == "pids":  # what the decoder can see of the processes around it
            result = dataclasses.replace(result, stats={**result.stats, "pid": os.getpid(), "ppid": os.getppid()})
        t = result.timing
        if a == "nan-wall":
            result = dataclasses.replace(result, timing=dataclasses.replace(t, wall_s=float("nan")))
        if a == "negative-wall":
            result = dataclasses.replace(result, timing=dataclasses.replace(t, wall_s=-1.0))
        if a == "ttft-past-wall":
            result = dataclasses.replace(result, timing=dataclasses.replace(t, ttft_s=t.wall_s + 10))
        yield 0, result
'''


@pytest.fixture
def attack(tmp_path, monkeypatch):
    (tmp_path / "attack.py").write_text(ATTACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("attack", None)


def _config(root: Path, candidates: dict[str, dict], baseline: dict | None = None) -> Path:
    """Three items (a, b, c) on tiny-llama, greedy; candidates: name -> {attack, at} ({} = standard)."""
    suite = root / "s.jsonl"
    rows = [{"suite": "s", "version": "1", "description": "attacks", "smoke": list("abc"),
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}}]
    rows += [{"id": i, "prompt": p, "references": ["zz"]} for i, p in zip("abc", ("first one", "middle one", "last"))]
    suite.write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    def table(o: dict | None) -> str:
        if not o:
            return 'decoder = "standard"\n'
        return f'decoder = "attack:Attack"\noptions = {{ attack = "{o["attack"]}", at = {o["at"]} }}\n'
    cands = "".join(f'[[candidates]]\nname = "{n}"\n{table(o)}' for n, o in candidates.items())
    cfg = root / "attack.toml"
    cfg.write_text(f'target = "tiny-llama"\n[baseline]\nname = "baseline"\n{table(baseline)}{cands}'
                   f'[suites.s]\npath = "{suite}"\n[profiles.smoke]\nsubset = "smoke"\nsuites = ["s"]\n'
                   'temperatures = [0.0]\nseeds = [0]\n')
    return cfg


def _regress(cfg: Path, run_dir: Path) -> int:
    return main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", "--no-tracking",
                 "--item-timeout", "5"])


def _verdicts(run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    return {n: c["verdict"] for n, c in s["candidates"].items()}


# --------------------------------------------------------------- the pipe carries pickles


def test_a_pickle_on_the_pipe_cannot_run_code_in_the_parent(attack):
    """The parent unpickles what the worker sends: an object whose __reduce__ names any callable
    runs it in the parent. Here it replaces the exit-code function, and a broken candidate exits 0."""
    import harness.verdict.exit_code as ec
    real = ec.exit_code
    try:
        cfg = _config(attack, {"fine": {}, "evil": {"attack": "pickle", "at": 2}})
        code = _regress(cfg, attack / "run")
        patched = ec.exit_code is not real
    finally:
        ec.exit_code = real
    assert not patched, "the worker ran code in the parent"
    assert code == 1 and _verdicts(attack / "run")["evil"] == "fail"


@pytest.mark.parametrize("what", ["not-a-tuple", "not-json", "short-message"])
def test_a_malformed_message_is_the_decoders_break_not_exit_3(attack, what):
    """A message that is not the protocol's (written by the decoder on the worker's pipe) is that
    candidate's FAIL, the others judged; never decodegate's internal error."""
    cfg = _config(attack, {"fine": {}, "bad": {"attack": what, "at": 2}})
    code = _regress(cfg, attack / "run")
    assert code == 1, code
    assert _verdicts(attack / "run") == {"fine": "pass", "bad": "fail"}


# --------------------------------------------------------------- the run folder is the decoder's too


def _erase_and_rerun(attack, monkeypatch) -> None:
    """Run 1: the candidate raises on its second item (FAIL, a stop row). Run 2: its load empties
    stops.jsonl; the candidate must still be FAIL, exit 1."""
    run_dir = attack / "run"
    monkeypatch.setenv("ATTACK_RUN_DIR", str(run_dir))
    cfg = _config(attack, {"fine": {}, "eraser": {"attack": "raise-once-then-erase-stops", "at": 2}})
    assert _regress(cfg, run_dir) == 1 and _verdicts(run_dir)["eraser"] == "fail"
    again = _regress(cfg, run_dir)
    assert (again, _verdicts(run_dir)["eraser"]) == (1, "fail")


def test_a_decoder_cannot_erase_its_death_from_the_run_folder(attack, monkeypatch):
    """Run 1: the candidate raises on its second item (FAIL, a stop row). Run 2: its load, which
    runs before the parent reads the folder's ledger, empties stops.jsonl. Before, the death was
    forgotten, the candidate resumed, and the run exited 0. Now the worker sees the run folder
    read-only (its own mount namespace, where the kernel gives one): the write fails, and the
    candidate stays FAIL."""
    if not _pid_namespaces():
        pytest.skip("no namespaces for this process here: the run folder stays writable to decoders")
    _erase_and_rerun(attack, monkeypatch)


@pytest.mark.xfail(strict=True, reason="without namespaces the run folder is writable to the decoder (same user): "
                   "an unprivileged layer that forbids it (Landlock allows by path, so it cannot leave out one "
                   "folder simply) is still to come")
def test_without_namespaces_a_decoder_still_erases_its_death(attack, monkeypatch):
    """As above, with unshare refused (an unprivileged worker, a container without
    CAP_SYS_ADMIN): the load empties stops.jsonl, and the rerun passes the candidate, exit 0."""
    import harness.run.namespaces as ns
    monkeypatch.setattr(ns, "CLONE_NEWPID", 0x1)  # no CLONE_* flag: unshare(2) is refused
    _erase_and_rerun(attack, monkeypatch)


@pytest.mark.parametrize("how", ["unmount", "remount", "proc-root"])
def test_a_decoder_cannot_get_round_the_read_only_run_folder(attack, monkeypatch, how):
    """As above, but the decoder's load first undoes the read-only mount: it runs as root in a
    mount namespace of its own (unmount the bind, or remount it writable), or it reaches the run
    folder through the host's /proc (/proc/<pid>/root of a process outside its namespaces, which
    the PID namespace leaves visible). Before, each of them erased the stop row, and the rerun
    passed the candidate that had raised, exit 0. Now the decoder holds no capability (nor can
    regain one by exec), and /proc is its namespace's own."""
    if not _pid_namespaces():
        pytest.skip("no namespaces for this process here: the run folder stays writable to decoders")
    run_dir = attack / "run"
    monkeypatch.setenv("ATTACK_RUN_DIR", str(run_dir))
    cfg = _config(attack, {"fine": {}, "eraser": {"attack": f"{how}-then-erase-stops" if how != "proc-root"
                                                  else "proc-root-erase-stops", "at": 2}})
    assert _regress(cfg, run_dir) == 1 and _verdicts(run_dir)["eraser"] == "fail"
    again = _regress(cfg, run_dir)
    assert (again, _verdicts(run_dir)["eraser"]) == (1, "fail")
    assert (run_dir / "stops.jsonl").read_text().strip()


def test_a_decoders_own_child_does_not_outlive_the_run(attack):
    """The worker dies with the parent (PR_SET_PDEATHSIG), but a process the decoder forked does
    not inherit that: after the run it is still there (holding the GPU, the run folder, a port)."""
    cfg = _config(attack, {"fine": {}, "parent": {"attack": "orphan", "at": 2}})
    assert _regress(cfg, attack / "run") == 1
    name = (attack / "orphan.name").read_text()
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if f"({name})" in stat and stat.rsplit(")", 1)[1].split()[0] != "Z":
            alive.append(int(pid))
            os.kill(int(pid), signal.SIGKILL)
    assert not alive, f"the decoder's child {name} (pids {alive}) outlived the run"


def test_a_huge_result_is_refused_at_the_pipe(attack, monkeypatch):
    """A result of hundreds of MB (here 3 MiB against a 1 MiB limit) is read whole by the parent,
    parsed twice and written to records.jsonl; it must be the candidate's break, others judged."""
    import harness.run.worker as w
    monkeypatch.setattr(w, "MESSAGE_LIMIT", 2 ** 20, raising=False)
    cfg = _config(attack, {"fine": {}, "huge": {"attack": "huge", "at": 2}})
    assert _regress(cfg, attack / "run") == 1
    assert _verdicts(attack / "run") == {"fine": "pass", "huge": "fail"}
    assert max(map(len, (attack / "run" / "records.jsonl").read_text().splitlines())) < 2 ** 20


# --------------------------------------------------------------- timings the decoder reports


@pytest.mark.parametrize("what", ["nan-wall", "negative-wall", "ttft-past-wall"])
def test_a_timing_that_cannot_be_measured_is_garbage(attack, what):
    """A wall time that is NaN or negative, or a first token after the whole request, is not a
    measurement: that item cannot be judged (the candidate fails), never exit 3, never a pass."""
    cfg = _config(attack, {"fine": {}, "liar": {"attack": what, "at": 2}})
    code = _regress(cfg, attack / "run")
    assert code == 1, code
    assert _verdicts(attack / "run") == {"fine": "pass", "liar": "fail"}


# --------------------------------------------------------------- load


@pytest.mark.full  # a child regress, bounded by a timeout
def test_a_decoder_that_hangs_in_init_is_stopped(attack):
    """A decoder whose __init__ never returns (a lock, a download that never ends): the run must
    not wait for it forever; it is that candidate's FAIL, the others judged."""
    cfg = _config(attack, {"fine": {}, "stuck": {"attack": "hang-on-load", "at": 0}})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), str(attack)]),
           "OMP_NUM_THREADS": "1"}
    script = ("import sys, harness.run.worker as w; w.LOAD_LIMIT_S = 20; from harness.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    child = subprocess.Popen([sys.executable, "-c", script, "regress", "--config", str(cfg), "--run-dir",
                              str(attack / "run"), "--no-tracking", "--no-progress"], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = child.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        pytest.fail("regress still waiting for a decoder's __init__ after 300 s")
    assert child.returncode == 1, err[-3000:]
    assert _verdicts(attack / "run") == {"fine": "pass", "stuck": "fail"}


# --------------------------------------------------------------- the decoder kills the parent


def _child(cfg: Path, run_dir: Path, timeout: float = 600, extra=("--item-timeout", "5")) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), str(cfg.parent)]),
           "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "harness.cli", "regress", "--config", str(cfg), "--run-dir",
                              str(run_dir), "--no-tracking", "--no-progress", *extra], env=env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        return subprocess.CompletedProcess(child.args, None, out, err)  # returncode None: it hung
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def _pid_namespaces() -> bool:
    """Whether this kernel gives this process a PID namespace (root, or a user namespace)."""
    import ctypes
    pid = os.fork()
    if pid == 0:
        os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(0x20000000) == 0 else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_a_decoder_cannot_name_decodegate(attack):
    """The decoder's parent is never decodegate (here: this test's process, which runs `regress`
    in process): it is pid 1 of the worker's own PID namespace, the decoder pid 2 there, where
    the kernel gives one; else a process of the worker. Before, os.getppid() was decodegate."""
    cfg = _config(attack, {"seer": {"attack": "pids", "at": 2}})
    assert _regress(cfg, attack / "run") == 0
    rows = [json.loads(x) for x in (attack / "run" / "records.jsonl").read_text().splitlines()]
    seen = next(r["stats"] for r in rows if r["candidate"] == "seer" and "pid" in r["stats"])
    assert seen["ppid"] != os.getpid()
    if _pid_namespaces():
        assert (seen["pid"], seen["ppid"]) == (2, 1)


@pytest.mark.full  # child regresses
@pytest.mark.parametrize("how", ["kill-parent", "term-parent", "stop-parent"])
def test_a_decoder_cannot_kill_or_stop_decodegate(attack, how):
    """The decoder sends SIGKILL (SIGTERM, SIGSTOP) to os.getppid(), then waits. Before, that was
    decodegate: the run died (or stopped for good), and the rerun read it as "killed from
    outside", resumed, and passed the decoder that did it. Now the decoder's parent is its
    worker's namespace (pid 1, which ignores it) or, without a PID namespace, a process of its
    worker: the run goes on and finishes with its verdict (the decoder, stuck past the item
    limit, FAIL as hung), and the rerun keeps it."""
    cfg = _config(attack, {"fine": {}, "attacker": {"attack": how, "at": 2}})
    for _ in range(2):
        run = _child(cfg, attack / "run", timeout=300)
        assert run.returncode == 1, (run.returncode, run.stderr[-3000:])
        assert _verdicts(attack / "run") == {"fine": "pass", "attacker": "fail"}


# --------------------------------------------------------------- the exit code from hand-made folders


def _folder(path: Path, plan, summary, rows=(), stops=()) -> Path:
    path.mkdir()
    (path / PLAN).write_text(json.dumps(plan))
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "stops.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stops))
    return path


def _row(c, i):
    return {"candidate": c, "suite": "s", "item_id": i, "seed": 0, "temperature": 0.0}


PASS = {"verdict": "pass", "candidates": {"cand": {"verdict": "pass"}}}


@pytest.mark.parametrize("plan", [{}, {"rows": []}, {"rows": None, "baselines": ["base"]}])
def test_an_empty_plan_is_no_complete_verdict(tmp_path, plan):
    """A plan that asks for nothing cannot show a verdict complete: no row was checked."""
    code, why = __import__("harness.verdict.exit_code", fromlist=["x"]).exit_code(
        _folder(tmp_path / "r", plan, PASS, [_row("base", "a"), _row("cand", "a")]))
    assert code == 1 and why


@pytest.mark.parametrize("bad", ["plan", "summary", "row", "stop"])
def test_a_folder_of_the_wrong_shape_is_1_not_an_escape(tmp_path, bad):
    """Fail closed, in the function: a plan or summary that is not an object, a row without its
    key, a stop that is not an object is 'no verdict' (1), never an exception (exit 3)."""
    from harness.verdict.exit_code import exit_code
    plan = {"rows": [["base", "s", "a", 0, 0.0], ["cand", "s", "a", 0, 0.0]], "baselines": ["base"]}
    rows, stops, summary = [_row("base", "a"), _row("cand", "a")], [], PASS
    if bad == "plan":
        plan = [["cand", "s", "a", 0, 0.0]]
    elif bad == "summary":
        summary = ["pass"]
    elif bad == "row":
        rows = [_row("base", "a"), {"candidate": "cand", "suite": "s"}]
    else:
        stops = [["cand", "s"]]
    code, why = exit_code(_folder(tmp_path / "r", plan, summary, rows, stops))
    assert code == 1 and why


def test_a_crashed_floor_candidate_does_not_hide_its_missing_rows(tmp_path):
    """The A/A floor is not on trial, but it is what the exact candidates are judged against: its
    worker's death (a 'crashed' stop) is no design choice, and its rows missing are no pass."""
    from harness.verdict.exit_code import exit_code
    plan = {"rows": [[c, "s", i, 0, 0.0] for c in ("base", "cand", "aa") for i in "ab"], "baselines": ["base"]}
    summary = {"verdict": "pass", "candidates": {"cand": {"verdict": "pass"}, "aa": {"verdict": "floor"}}}
    rows = [_row(c, i) for c in ("base", "cand") for i in "ab"] + [_row("aa", "a")]
    stops = [{"candidate": "aa", "suite": "*", "reason": "crashed", "detail": "killed by SIGSEGV"}]
    code, why = exit_code(_folder(tmp_path / "r", plan, summary, rows, stops))
    assert code == 1 and "aa s/b" in why


def test_an_item_with_nothing_to_scale_by_is_still_bounded():
    from harness.run.faults import UNKNOWN_ITEM_LIMIT_S, Policy, item_limit
    assert item_limit(Policy(), None) == UNKNOWN_ITEM_LIMIT_S < float("inf")
    assert item_limit(Policy(), 0.5) == 60.0 and item_limit(Policy(item_timeout=5.0), None) == 5.0


@pytest.mark.full  # a child regress, bounded by the baseline's slowest item so far
def test_a_hung_user_baseline_is_bounded_without_item_timeout(attack):
    """A user decoder as the baseline that never answers its second item, under the defaults (no
    --item-timeout): the baseline's items have no limit (item_limit has no baseline wall to scale),
    so the parent waits on its worker forever; expected exit 2 (a broken baseline), rows kept."""
    cfg = _config(attack, {"fine": {}}, baseline={"attack": "hang", "at": 2})
    first = _child(cfg, attack / "run", timeout=240, extra=())
    assert first.returncode == 2, "regress hung on a hung baseline" if first.returncode is None else first.stderr[-3000:]


# --------------------------------------------------------------- decodegate's code is not the decoder's


def test_a_decoder_cannot_plant_code_where_decodegate_imports_from(attack):
    """The parent imports lazily after generation (lm-eval, the verdict's modules): a module the
    decoder writes into decodegate's own folder or the site-packages it imports from runs in the
    parent (exit 0 from there). Before, both were writable to the decoder; now they are read-only
    in its mount namespace, as the run folder is."""
    if not _pid_namespaces():
        pytest.skip("no namespaces for this process here: decodegate's folders stay writable to decoders")
    cfg = _config(attack, {"planter": {"attack": "plant", "at": 2}})
    _regress(cfg, attack / "run")
    rows = [json.loads(x) for x in (attack / "run" / "records.jsonl").read_text().splitlines()]
    planted = next(r["stats"]["planted"] for r in rows if r["candidate"] == "planter" and "planted" in r["stats"])
    for path in planted:
        if os.path.exists(path):
            os.unlink(path)
    assert len(planted) == 2 and "written" not in planted.values(), planted


# --------------------------------------------------------------- a hang names where it hung


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "unprivileged"])
@pytest.mark.full
def test_a_hung_decoders_python_stack_is_in_its_traceback(attack, monkeypatch, namespaces):
    """Past the item limit the parent signals the worker's group (SIGUSR1) for the decoder's
    Python stack, then kills it: the decoder runs two processes down (one without namespaces),
    and its traceback file must show the line it hung on, not the worker's wait."""
    if not namespaces:
        import harness.run.namespaces as ns
        monkeypatch.setattr(ns, "CLONE_NEWPID", 0x1)  # no CLONE_* flag: unshare(2) is refused
    cfg = _config(attack, {"fine": {}, "stuck": {"attack": "hang", "at": 2}})
    assert _regress(cfg, attack / "run") == 1
    stops = [json.loads(x) for x in (attack / "run" / "stops.jsonl").read_text().splitlines()]
    stop = next(s for s in stops if s["candidate"] == "stuck")
    assert stop["reason"] == "hung", stop
    trace = (attack / "run" / stop["traceback"]).read_text()
    line = next(i for i, x in enumerate(ATTACK.splitlines(), 1) if 'if a == "hang":' in x) + 1
    assert f"attack.py\", line {line} in generate_many" in trace, trace[-2000:]


# --------------------------------------------------------------- a decoder's module, imported by decodegate


@pytest.mark.parametrize("how", ["os._exit(0)", pytest.param("sys.exit(0)", marks=pytest.mark.full)])
def test_a_decoder_module_that_exits_on_import_gives_no_exit_0_or_3(attack, how):
    """A plugin module that ends the process at import (a library that exits on import, a hostile
    plugin). decodegate imports the module itself (the preflight, the code fingerprint): before,
    os._exit(0) there was regress's exit 0 with no run folder at all, sys.exit(0) its exit 3
    ("internal error"). Now the preflight imports it in a child first: an input error (2) naming
    the decoder and how its import ended."""
    (attack / "exiter.py").write_text(f"import os, sys\n{how}\nfrom decoders.standard import StandardDecoder\n\n\n"
                                      "class Exiter(StandardDecoder):\n    pass\n")
    cfg = _config(attack, {"fine": {}, "exiter": {"attack": "none", "at": 0}})
    cfg.write_text(cfg.read_text().replace('decoder = "attack:Attack"\noptions = { attack = "none", at = 0 }',
                                           'decoder = "exiter:Exiter"'))
    run = _child(cfg, attack / "run", timeout=300)
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    ended = "ended the process (exited with status 0)" if how == "os._exit(0)" else "raised SystemExit"
    assert f"'exiter' (decoder 'exiter:Exiter'): importing its module {ended}" in run.stderr, run.stderr[-2000:]
