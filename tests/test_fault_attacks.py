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


class Evil:
    """Unpickled in the parent: any callable with any arguments runs there."""
    def __reduce__(self):
        return (exec, ("import harness.verdict.exit_code as m; m.exit_code = lambda d: (0, '')",))


class Attack(StandardDecoder):
    def __init__(self, target, attack="none", at=0, **options):
        if attack == "hang-on-load":
            time.sleep(10 ** 6)
        if attack == "raise-once-then-erase-stops":
            # The decoder runs as the user who owns the run folder (a real one finds it in
            # /proc/<ppid>/cmdline): on the rerun its load empties the ledger of deaths.
            stops = os.path.join(os.environ["ATTACK_RUN_DIR"], "stops.jsonl")
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
        if a == "raise-once-then-erase-stops":
            mark = os.path.join(os.path.dirname(__file__), a + ".done")
            if not os.path.exists(mark):
                open(mark, "w").close()
                raise RuntimeError("broken on its second item")
        if a == "huge":
            result = dataclasses.replace(result, stats={**result.stats, "blob": "x" * (3 * 2 ** 20)})
        if a == "hang":
            time.sleep(10 ** 6)
        if a == "orphan":  # a pool, a tokenizer's helper, a server the decoder started: outlives its worker
            pid = os.fork()
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            with open(os.path.join(os.path.dirname(__file__), "orphan.pid"), "w") as f:
                f.write(str(pid))
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


@pytest.mark.xfail(strict=True, reason="open: a decoder runs as the run folder's user and can rewrite it "
                   "(a read-only view of the folder for workers is the fix; docs/own-decoder.md)")
def test_a_decoder_cannot_erase_its_death_from_the_run_folder(attack, monkeypatch):
    """Run 1: the candidate raises on its second item (FAIL, a stop row). Run 2: its load, which
    runs before the parent reads the folder's ledger, empties stops.jsonl; the death is forgotten,
    the candidate resumes, and the run exits 0."""
    run_dir = attack / "run"
    monkeypatch.setenv("ATTACK_RUN_DIR", str(run_dir))
    cfg = _config(attack, {"fine": {}, "eraser": {"attack": "raise-once-then-erase-stops", "at": 2}})
    assert _regress(cfg, run_dir) == 1 and _verdicts(run_dir)["eraser"] == "fail"
    again = _regress(cfg, run_dir)
    assert (again, _verdicts(run_dir)["eraser"]) == (1, "fail")


def test_a_decoders_own_child_does_not_outlive_the_run(attack):
    """The worker dies with the parent (PR_SET_PDEATHSIG), but a process the decoder forked does
    not inherit that: after the run it is still there (holding the GPU, the run folder, a port)."""
    cfg = _config(attack, {"fine": {}, "parent": {"attack": "orphan", "at": 2}})
    assert _regress(cfg, attack / "run") == 1
    pid = int((attack / "orphan.pid").read_text())
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    if state not in ("gone", "Z"):
        os.kill(pid, signal.SIGKILL)
    assert state in ("gone", "Z"), f"the decoder's child {pid} outlived the run"


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


@pytest.mark.full  # child regresses
@pytest.mark.xfail(strict=True, reason="open: a worker can signal decodegate itself (a PID namespace or a "
                   "seccomp rule on kill for workers is the fix; docs/own-decoder.md)")
@pytest.mark.parametrize("how", ["kill-parent", "term-parent"])
def test_a_decoder_that_kills_the_parent_is_not_passed_on_the_rerun(attack, how):
    """The decoder SIGKILLs (SIGTERMs) decodegate itself (os.getppid()) once. The run dies (no
    verdict, not 0), and the rerun must not read it as "killed from outside", resume, and PASS
    the decoder that did it."""
    cfg = _config(attack, {"fine": {}, "killer": {"attack": how, "at": 2}})
    first = _child(cfg, attack / "run")
    assert first.returncode not in (0, None), first.stderr[-3000:]
    again = _child(cfg, attack / "run")
    assert again.returncode == 1 and _verdicts(attack / "run")["killer"] == "fail", again.stderr[-3000:]


@pytest.mark.full  # a child regress that hangs now
@pytest.mark.xfail(strict=True, reason="open: a worker can signal decodegate itself (docs/own-decoder.md)")
def test_a_decoder_that_stops_the_parent_does_not_hang_the_run(attack):
    """SIGSTOP to os.getppid(): nothing in decodegate runs again; CI waits for its own timeout."""
    cfg = _config(attack, {"fine": {}, "stopper": {"attack": "stop-parent", "at": 2}})
    first = _child(cfg, attack / "run", timeout=45)  # a stopped parent stays stopped: a run of this config takes ~10 s
    assert first.returncode is not None, "regress hung: the decoder stopped it"


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
