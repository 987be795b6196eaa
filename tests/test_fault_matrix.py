"""The fault-injection matrix (issue 57), as SQLite tests its recovery: a test decoder applies a
fault chosen by the test, at a chosen call, and after each run (and after a second run on the same
folder) the invariants are checked through the run folder and the exit code:

- exit 0 never with a broken or missing row, and never 3 (decodegate's own bug);
- a broken candidate is FAIL, its line naming the fault, the item and file:line or the signal;
- every other candidate is judged in the same run; a broken baseline is exit 2;
- no row that was written is lost, and the second run keeps the first run's verdict (a death is
  remembered, whatever killed the worker, even where a rerun would have gone through).

The cases are generated: {fault} x {baseline, candidate} x {first, middle, last item} x {greedy,
sampled}. Candidate faults share a run (each candidate is its own worker: that one fault at that
one call is all that differs), baseline faults get a run each. `make check` runs a slice (one fault
of each kind as a candidate, one as the baseline); `make test` the whole matrix (marked full).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.run.records import PLAN

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FAULTY = '''\
import ctypes
import os
import signal
import sys
import threading
import time

import numpy as np

from decoders.base import DecoderError
from decoders.standard import StandardDecoder


class Odd(BaseException):
    pass


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")


class CrashOnLoad(StandardDecoder):
    """A decoder that never loads, with no options of its own."""

    def __init__(self, target, **options):
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")


class Faulty(StandardDecoder):
    """A correct decoder that applies `fault` on its `at`-th call."""

    def __init__(self, target, fault="none", at=0, **options):
        if fault == "raise-on-load":
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")  # FAULT LINE load
        if fault == "exit-on-load":
            os._exit(3)
        super().__init__(target, **options)
        self.fault, self.at, self.calls = fault, at, 0

    def generate_many(self, requests):
        self.calls += 1
        if self.fault == "slow":
            time.sleep(1)
        if self.calls != self.at:
            yield from super().generate_many(requests)
            return
        f = self.fault
        if f == "duplicate-index":
            result = self.generate(requests[0])
            yield 0, result
            yield 0, result
        elif f == "missing-index":
            return
        elif f == "decoder-error":
            raise DecoderError("this item is refused by generate_many")
        else:
            yield 0, self.apply(f, requests[0])

    def apply(self, f, request):
        result = self.generate(request)
        import dataclasses
        if f == "raise":
            return [][1]  # FAULT LINE raise
        if f == "sys-exit":
            sys.exit()
        if f == "os-exit-0":
            os._exit(0)
        if f == "os-exit-1":
            os._exit(1)
        if f == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f == "sigsegv":
            ctypes.string_at(0)
        if f == "keyboard-interrupt":
            raise KeyboardInterrupt
        if f == "base-exception":
            raise Odd("a BaseException of its own")
        if f == "unprintable":
            raise Unprintable()
        if f == "hang":
            time.sleep(10 ** 6)
        if f == "hang-gil":
            ctypes.PyDLL(None).sleep(10 ** 6)  # libc sleep(3) called holding the GIL
        if f == "eat-memory":
            # 16 GiB, never touched: without the cap it costs nothing, under it the allocation fails
            self.hoard = np.empty(2 ** 34, dtype=np.uint8)  # FAULT LINE memory
        if f == "leaked-thread":
            threading.Thread(target=time.sleep, args=(10 ** 6,)).start()
        if f == "nan-margins":
            return dataclasses.replace(result, margins=tuple(float("nan") for _ in result.margins))
        if f == "oov":
            return dataclasses.replace(result, tokens=(10 ** 6,) + tuple(result.tokens[1:]))
        if f == "numpy-scalar":
            return dataclasses.replace(result, stats={**result.stats, "score": np.float32(0.5), "n": np.int64(3)})
        if f == "object-in-stats":
            return dataclasses.replace(result, stats={**result.stats, "when": object()})
        return result
'''
LINES = {f: i for i, line in enumerate(FAULTY.splitlines(), 1) if "# FAULT LINE" in line
         for f in [line.split("# FAULT LINE ")[1]]}

# What each fault gives a candidate: (gate that fails, words its line must hold). None: the
# decoder stays correct (a numpy scalar is converted, a leaked thread dies with its worker).
CANDIDATE = {
    "raise": ("raised", f"raised IndexError on s/{{item}} (T={{t}}, seed 0) at faulty.py:{LINES['raise']}"),
    "sys-exit": ("raised", "raised SystemExit on s/{item}"),
    "os-exit-0": ("crashed", "crashed on s/{item} (T={t}, seed 0): exited with status 0"),
    "os-exit-1": ("crashed", "crashed on s/{item} (T={t}, seed 0): exited with status 1"),
    "sigkill": ("crashed", "crashed on s/{item} (T={t}, seed 0): killed by SIGKILL"),
    "sigsegv": ("crashed", "crashed on s/{item} (T={t}, seed 0): killed by SIGSEGV"),
    "keyboard-interrupt": ("raised", "raised KeyboardInterrupt on s/{item}"),
    "base-exception": ("raised", "raised Odd on s/{item}"),
    "unprintable": ("raised", "raised Unprintable on s/{item}"),
    "hang": ("hung", "hung on s/{item} (T={t}, seed 0): no result after"),
    "hang-gil": ("hung", "hung on s/{item} (T={t}, seed 0): no result after"),
    "eat-memory": ("crashed", f"crashed (out of memory: MemoryError) on s/{{item}} (T={{t}}, seed 0) at "
                              f"faulty.py:{LINES['memory']}"),
    "leaked-thread": None,
    "nan-margins": ("errors", "margin nan at position 0"),
    "oov": ("errors", "token id 1000000 at position 0 is outside the vocabulary"),
    "numpy-scalar": None,
    "object-in-stats": ("errors", "a result that cannot be judged: a result that is not plain data"),
    "duplicate-index": ("raised", "broke the generate_many contract on s/{item}"),
    "missing-index": ("raised", "broke the generate_many contract on s/{item}"),
    "decoder-error": ("errors", "this item is refused by generate_many"),
    "raise-on-load": ("crashed", f"crashed on load: RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB "
                                 f"(at faulty.py:{LINES['load']})"),
    "exit-on-load": ("crashed", "crashed on load: exited with status 3"),
}
# Faults that end a call or the worker: in the baseline, the run stops (exit 2), rows kept.
STOPS_A_BASELINE = [f for f, v in CANDIDATE.items() if v is not None and v[0] != "errors"]
POSITIONS = {"first": 1, "middle": 2, "last": 3}
ITEMS = {1: "a", 2: "b", 3: "c"}
PROFILES = {"greedy": "temperatures = [0.0]\nseeds = [0]\n",
            "sampled": 'temperatures = [0.7]\nseeds = [0]\nsample_suites = ["s"]\n'}
ITEM_TIMEOUT = "5"  # seconds: the tiny model's items take milliseconds (below 1 s on a loaded 2-core machine)
WORKER_MEMORY = "2"  # GiB beyond what a worker inherits: the tiny model needs a few MiB


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    (tmp_path / "faulty.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("faulty", None)


def _config(root: Path, profile: str, baseline: dict, candidates: dict[str, dict]) -> Path:
    """Three items (a, b, c), tiny-llama, the given baseline and candidates (name: options)."""
    suite = root / "s.jsonl"
    rows = [{"suite": "s", "version": "1", "description": "fault matrix", "smoke": list("abc"),
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}}]
    rows += [{"id": i, "prompt": p, "references": ["zz"]} for i, p in zip("abc", ("first one", "middle one", "last"))]
    suite.write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    def table(opts: dict) -> str:
        if not opts:
            return 'decoder = "standard"\n'
        return f'decoder = "faulty:Faulty"\noptions = {{ fault = "{opts["fault"]}", at = {opts["at"]} }}\n'
    cands = "".join(f'[[candidates]]\nname = "{n}"\n{table(o)}' for n, o in candidates.items())
    cfg = root / f"{profile}.toml"
    cfg.write_text(f'target = "tiny-llama"\n[baseline]\nname = "baseline"\n{table(baseline)}{cands}'
                   f'[suites.s]\npath = "{suite}"\n[profiles.smoke]\nsubset = "smoke"\nsuites = ["s"]\n'
                   + PROFILES[profile])
    return cfg


def _regress(cfg: Path, run_dir: Path) -> int:
    return main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", "--no-tracking",
                 "--item-timeout", ITEM_TIMEOUT, "--worker-memory", WORKER_MEMORY])


def _rows(run_dir: Path) -> list[str]:
    path = run_dir / "records.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _complete(run_dir: Path) -> bool:
    """Every planned row present and not an error, read independently of harness.verdict.exit_code."""
    plan = json.loads((run_dir / PLAN).read_text())["rows"]
    have = {(r["candidate"], r["suite"], r["item_id"], r["seed"], r["temperature"]): r
            for r in map(json.loads, _rows(run_dir))}
    return all(tuple(k) in have and not have[tuple(k)].get("error") for k in plan)


def _check_candidates(run_dir: Path, code: int, faults: dict[str, str], where: int, t: str) -> None:
    assert code in (0, 1), code  # never 2 or 3: the baseline is fine, a candidate's break is a gate
    summary = _summary(run_dir)
    assert summary["candidates"]["fine"]["verdict"] == "pass"  # judged in the same run
    for name, fault in faults.items():
        cand = summary["candidates"][name]
        expect = CANDIDATE[fault]
        if expect is None:  # judged as the same decoder without the fault (at T > 0 alone: no gate applies)
            control = summary["candidates"]["control"]
            gates = lambda c: [(g["name"], g["status"]) for g in c["gates"]]  # noqa: E731
            assert (cand["verdict"], gates(cand)) == (control["verdict"], gates(control)), (fault, cand["gates"])
            continue
        gate, words = expect
        words = words.format(item=ITEMS[where], t=t)
        failed = {g["name"]: g["detail"] for g in cand["gates"] if g["status"] == "fail"}
        assert cand["verdict"] == "fail" and gate in failed, (fault, failed)
        assert words in failed[gate], (fault, failed[gate])
    assert (code == 0) == (summary["verdict"] == "pass" and _complete(run_dir))


def _candidate_case(faulty: Path, profile: str, where: int, faults: list[str]) -> None:
    t = "0" if profile == "greedy" else "0.7"
    named = {f.replace("-", "_"): f for f in faults}
    cfg = _config(faulty, profile, {}, {"fine": {}, "control": {"fault": "none", "at": 0},
                                        **{n: {"fault": f, "at": where} for n, f in named.items()}})
    run_dir = faulty / f"run-{profile}-{where}"
    code = _regress(cfg, run_dir)
    _check_candidates(run_dir, code, named, where, t)
    first = _rows(run_dir)
    again = _regress(cfg, run_dir)  # the second run: the same verdicts, every row kept
    assert again == code
    _check_candidates(run_dir, again, named, where, t)
    assert _rows(run_dir)[:len(first)] == first


def _baseline_case(faulty: Path, profile: str, where: int, fault: str) -> None:
    cfg = _config(faulty, profile, {"fault": fault, "at": where}, {"fine": {}})
    run_dir = faulty / f"run-{profile}-{where}-{fault}"
    for _ in range(2):  # the second run on the folder: still no verdict, still every row kept
        before = _rows(run_dir)
        code = _regress(cfg, run_dir)
        assert code == 2, (fault, code)
        assert not (run_dir / "summary.json").exists()
        assert _rows(run_dir)[:len(before)] == before
        assert sum(json.loads(r)["candidate"] == "baseline" for r in _rows(run_dir)) >= (
            0 if fault.endswith("on-load") else where - 1)


ALL_FAULTS = [f for f in CANDIDATE if not f.endswith("on-load")]


# `make check`'s slice: one fault of each way a decoder breaks (it raises, exits, is killed, hangs),
# each in its own worker, in one run and its rerun. Every worker is a process that imports torch
# and loads the model, so the whole list (20 workers, ~26 s quiet) is `make test`'s.
QUICK_FAULTS = ["raise", "os-exit-1", "sigkill", "hang"]


def test_one_fault_of_each_kind_as_a_candidate_on_its_middle_item(faulty):
    _candidate_case(faulty, "greedy", 2, QUICK_FAULTS)


@pytest.mark.full
def test_every_fault_as_a_candidate_on_its_middle_item(faulty):
    """Every fault once, each in its own worker, in one run."""
    _candidate_case(faulty, "greedy", 2, ALL_FAULTS + ["raise-on-load"])


@pytest.mark.full  # the every-fault slice again, unprivileged: the quick tier keeps one fault of each kind
def test_every_fault_as_a_candidate_without_namespaces(faulty, monkeypatch):
    """The same slice where the kernel gives the worker no namespace (an unprivileged user, a
    container without CAP_SYS_ADMIN): unshare is refused (here by a flag it does not know,
    EINVAL), the decoder runs one process down, and every fault is still named the same way."""
    import harness.run.namespaces as ns
    monkeypatch.setattr(ns, "CLONE_NEWPID", 0x1)  # no CLONE_* flag: unshare(2) fails, with or without NEWNS
    _candidate_case(faulty, "greedy", 2, ALL_FAULTS + ["raise-on-load"])


@pytest.mark.parametrize("fault", [pytest.param("sys-exit", marks=pytest.mark.full), "sigkill",
                                   pytest.param("exit-on-load", marks=pytest.mark.full)])
def test_a_baseline_fault_stops_the_run(faulty, fault):
    _baseline_case(faulty, "greedy", 1 if fault == "exit-on-load" else 2, fault)


@pytest.mark.full
@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("where", list(POSITIONS))
def test_the_candidate_matrix(faulty, profile, where):
    _candidate_case(faulty, profile, POSITIONS[where], ALL_FAULTS + ["raise-on-load", "exit-on-load"])


@pytest.mark.full
@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("where", list(POSITIONS))
@pytest.mark.parametrize("fault", STOPS_A_BASELINE)
def test_the_baseline_matrix(faulty, profile, where, fault):
    _baseline_case(faulty, profile, POSITIONS[where], fault)


@pytest.mark.full  # the quick slice's sigkill is remembered on its rerun the same way
def test_a_candidate_killed_on_its_third_item_stays_failed_on_the_rerun(faulty):
    """SIGKILL (what the out-of-memory killer sends) on the third item: FAIL in this run, and on
    the rerun, where a fresh worker would have gone through (its fault counts calls)."""
    _candidate_case(faulty, "greedy", 3, ["sigkill"])


def _child(cfg: Path, run_dir: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), str(cfg.parent)]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "regress", "--config", str(cfg), "--run-dir",
                             str(run_dir), "--no-tracking", "--no-progress"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.mark.full  # a child regress
def test_a_leaked_thread_does_not_keep_the_run_alive(faulty):
    cfg = _config(faulty, "greedy", {}, {"leaky": {"fault": "leaked-thread", "at": 1}})
    child = _child(cfg, faulty / "run")
    out, err = child.communicate(timeout=600)  # before issue 57: the verdict was written, and no exit
    assert child.returncode == 0, err[-3000:]
    assert _summary(faulty / "run")["candidates"]["leaky"]["verdict"] == "pass"


@pytest.mark.full  # a child regress
def test_ctrl_c_stops_the_whole_run_and_the_rerun_resumes(faulty):
    """Ctrl-C reaches the terminal's whole process group, workers included: the run ends with 130,
    its rows kept, and the next run goes on from there (no decoder is blamed)."""
    cfg = _config(faulty, "greedy", {}, {"slow": {"fault": "slow", "at": 0}})
    run_dir = faulty / "run"
    # SIGINT as a terminal leaves it: a test run started in the background of a non-interactive
    # shell inherits it ignored, and Python then installs no KeyboardInterrupt (the run ended 0).
    child = _child(cfg, run_dir, start_new_session=True,
                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while len(_rows(run_dir)) < 2 and child.poll() is None:
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGINT)
    out, err = child.communicate(timeout=600)
    assert child.returncode == 130, err[-3000:]
    kept = _rows(run_dir)
    assert 2 <= len(kept) < 6 and not (run_dir / "summary.json").exists()
    assert _regress(cfg, run_dir) == 0
    assert _rows(run_dir)[:len(kept)] == kept and len(_rows(run_dir)) == 6


def test_the_docs_table_names_every_fault_of_the_matrix():
    """docs/own-decoder.md's table is the matrix's: a fault added here must be documented there."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "own-decoder.md").read_text()
    table = [line for line in doc.splitlines() if line.startswith("| ")]
    for fault in CANDIDATE:
        assert any(f"`{fault}`" in line for line in table), fault


def _folder(tmp_path: Path, rows: list, stops: list = (), verdict: str = "pass") -> Path:
    tmp_path.mkdir()
    plan = [["base", "s", i, 0, 0.0] for i in "ab"] + [["cand", "s", i, 0, 0.0] for i in "ab"]
    (tmp_path / PLAN).write_text(json.dumps({"rows": plan, "baselines": ["base"]}))
    (tmp_path / "summary.json").write_text(json.dumps({"verdict": verdict, "candidates": {"cand": {"verdict": verdict}}}))
    (tmp_path / "records.jsonl").write_text("".join(json.dumps({"candidate": c, "suite": "s", "item_id": i, "seed": 0,
                                                                "temperature": 0.0, **extra}) + "\n"
                                                    for c, i, extra in rows))
    (tmp_path / "stops.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stops))
    return tmp_path


def test_exit_0_only_from_a_complete_passing_folder(tmp_path):
    from harness.verdict.exit_code import exit_code
    every = [(c, i, {}) for c in ("base", "cand") for i in "ab"]
    assert exit_code(_folder(tmp_path / "1", every)) == (0, "")
    code, why = exit_code(_folder(tmp_path / "2", every[:-1]))  # a summary that says pass, a row missing
    assert code == 1 and "cand s/b seed 0 T=0: missing" in why
    code, why = exit_code(_folder(tmp_path / "3", every[:-1] + [("cand", "b", {"error": "NaN"})]))
    assert code == 1 and "an error" in why
    assert exit_code(_folder(tmp_path / "4", every, verdict="fail"))[0] == 1
    # A candidate stopped by design (a sequential look, --fail-fast): its missing rows and the
    # baseline rows only it needed are not held against the run; its verdict still decides.
    stopped = [("base", "a", {}), ("cand", "a", {})]
    assert exit_code(_folder(tmp_path / "5", stopped, [{"candidate": "cand", "suite": "s", "reason": "decided"}]))[0] == 0
    (tmp_path / "6").mkdir()
    assert exit_code(tmp_path / "6")[0] == 1  # nothing to read: no verdict, no pass


def test_an_lmeval_only_plan_exits_0_only_when_every_task_run_finished(tmp_path):
    """lm-eval picks a task's items, so the plan names its runs (decoder, task, seed, T) and each
    needs its completion marker and no error row. Before, an lm-eval-only profile planned no row
    and a passing run exited 1 ("plans no generation")."""
    from harness.verdict.exit_code import exit_code
    units = [[c, "lmeval:t", 0, 0.0] for c in ("base", "cand")]
    done = [{"candidate": c, "suite": "lmeval:t", "seed": 0, "temperature": 0.0, "rows": 1} for c in ("base", "cand")]

    def folder(name, marks, extra=None, stops=(), keep=("base", "cand")):
        d = _folder(tmp_path / name, [], stops)
        (d / PLAN).write_text(json.dumps({"rows": [], "lmeval": units, "baselines": ["base"]}))
        rows = [{"candidate": c, "suite": "lmeval:t", "item_id": "0", "seed": 0, "temperature": 0.0}
                for c in ("base", "cand")]
        rows[1].update(extra or {})
        rows = [r for r in rows if r["candidate"] in keep]
        (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "lmeval_done.jsonl").write_text("".join(json.dumps(m) + "\n" for m in marks))
        return d
    assert exit_code(folder("1", done)) == (0, "")
    code, why = exit_code(folder("2", done[:1]))  # killed inside lm-eval: no marker for cand
    assert code == 1 and "cand lmeval:t seed 0 T=0: not finished" in why
    code, why = exit_code(folder("3", done, {"error": "boom"}))
    assert code == 1 and "an error row" in why
    assert exit_code(folder("4", done[:1], stops=[{"candidate": "cand", "suite": "lmeval:t", "reason": "decided"}]))[0] == 0
    assert exit_code(folder("5", done[:1], stops=[{"candidate": "cand", "suite": "*", "reason": "crashed"}]))[0] == 1


def test_an_lmeval_marker_holds_only_with_the_rows_it_counts(tmp_path):
    """Attacks on the lm-eval path through a hand-edited or half-forgotten folder (before, each
    exited 0): a marker whose run's rows are gone (deleted, or dropped when a decoder fixed after
    it broke ran again, which kept its markers), a marker that counts no rows, and the baseline's
    marker and rows removed under a stop row naming the baseline while its candidate ran."""
    from harness.verdict.exit_code import exit_code
    units = [[c, "lmeval:t", 0, 0.0] for c in ("base", "cand")]

    def folder(name, marks, keep=("base", "cand"), stops=(), items="01"):
        d = _folder(tmp_path / name, [], stops)
        (d / PLAN).write_text(json.dumps({"rows": [], "lmeval": units, "baselines": ["base"]}))
        rows = [{"candidate": c, "suite": "lmeval:t", "item_id": i, "seed": 0, "temperature": 0.0}
                for c in keep for i in items]
        (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "lmeval_done.jsonl").write_text("".join(
            json.dumps({"candidate": c, "suite": "lmeval:t", "seed": 0, "temperature": 0.0, **m}) + "\n"
            for c, m in marks))
        return d
    two = [("base", {"rows": 2}), ("cand", {"rows": 2})]
    assert exit_code(folder("1", two)) == (0, "")
    code, why = exit_code(folder("2", two, keep=("base",)))  # the candidate's rows gone, its marker kept
    assert code == 1 and "cand lmeval:t seed 0 T=0: not finished (its marker counts 2 rows, the folder holds 0)" in why
    code, why = exit_code(folder("3", two, items="0"))  # a row of each run gone
    assert code == 1 and "marker counts 2 rows, the folder holds 1" in why
    code, why = exit_code(folder("4", [("base", {"rows": 2}), ("cand", {})]))  # a marker without its count
    assert code == 1 and "cand lmeval:t seed 0 T=0: not finished" in why
    code, why = exit_code(folder("5", two[1:], keep=("cand",),
                                 stops=[{"candidate": "base", "suite": "lmeval:t", "reason": "decided"}]))
    assert code == 1 and "base lmeval:t seed 0 T=0: not finished" in why


def test_a_candidate_broken_before_the_lmeval_suites_is_not_run_through_them(faulty, tmp_path):
    """lm-eval runs after every other suite. A candidate that already broke (here: its worker
    failed to load) was still built for each task, in decodegate's own process: its fault then
    hit decodegate itself (before: exit 3, decodegate's own bug, after every other suite had run,
    no summary). Now a decoder that broke is left out of the lm-eval runs: the run finishes with
    its verdict, FAIL, and exit 1 (its lm-eval run is not finished)."""
    from harness.verdict.exit_code import exit_code
    local = Path(__file__).parent / "data" / "lmeval"
    cfg = _config(faulty, "greedy", {}, {"bad": {"fault": "raise-on-load", "at": 1}})
    text = cfg.read_text().replace('suites = ["s"]', 'suites = ["s", "lmeval:decodegate_tiny_gen"]')
    text = text.replace('decoder = "faulty:Faulty"\noptions = { fault = "raise-on-load", at = 1 }',
                        'decoder = "faulty:CrashOnLoad"')   # no options: lm-eval could build it
    cfg.write_text(text + f'[suites."lmeval:decodegate_tiny_gen"]\ninclude_path = "{local}"\nlimit = 2\n')
    run_dir = tmp_path / "run"
    assert _regress(cfg, run_dir) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["candidates"]["bad"]["verdict"] == "fail"
    marks = [json.loads(x) for x in (run_dir / "lmeval_done.jsonl").read_text().splitlines()]
    assert [m["candidate"] for m in marks] == ["baseline"]
    code, why = exit_code(run_dir)
    assert code == 1


def test_a_plugin_decoder_with_its_own_options_runs_an_lm_eval_suite(faulty, tmp_path):
    """A plugin decoder with options of its own, on a profile with an lm-eval suite. lm-eval's
    model took only the options it knows (a plugin's were refused, first after every other suite
    had generated, then in the pre-flight). Now lm-eval generates through the decoder in its
    worker, built as for every suite: its task runs, and the run is judged, exit 0."""
    local = Path(__file__).parent / "data" / "lmeval"
    cfg = _config(faulty, "greedy", {}, {"plugin": {"fault": "none", "at": 0}})
    text = cfg.read_text().replace('suites = ["s"]', 'suites = ["s", "lmeval:decodegate_tiny_gen"]')
    cfg.write_text(text + f'[suites."lmeval:decodegate_tiny_gen"]\ninclude_path = "{local}"\nlimit = 2\n')
    run_dir = tmp_path / "run"
    assert _regress(cfg, run_dir) == 0
    marks = [json.loads(x) for x in (run_dir / "lmeval_done.jsonl").read_text().splitlines()]
    assert sorted((m["candidate"], m["rows"]) for m in marks) == [("baseline", 2), ("plugin", 2)]
