"""A candidate that breaks is a verdict, not a crash (issue 52): a user's decoder that raises,
returns garbage, segfaults or hangs is named and failed, the other candidates are still judged,
and every row is kept. The decoders are real user decoders loaded as "module:Class" from a file;
the crash and the hang run `regress` in a child process, as they kill the process they are in."""
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
from harness.run.faults import HANG_FLOOR_S, UNKNOWN_ITEM_LIMIT_S, Policy, item_limit, whose

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[1]

USER_DECODERS = '''\
import ctypes
import dataclasses
import time

from decoders.standard import StandardDecoder


class Broken(StandardDecoder):
    calls = 0

    def generate(self, request):
        self.calls += 1
        if self.calls == 3:
            return [][self.calls]  # BROKEN LINE
        return super().generate(request)


class NaNMargins(StandardDecoder):
    def generate(self, request):
        result = super().generate(request)
        return dataclasses.replace(result, margins=tuple(float("nan") for _ in result.margins))


class OutOfVocabulary(StandardDecoder):
    def generate(self, request):
        result = super().generate(request)
        return dataclasses.replace(result, tokens=(10 ** 6,) + tuple(result.tokens[1:]))


class Segfaults(StandardDecoder):
    calls = 0

    def generate(self, request):
        self.calls += 1
        if self.calls == 2:
            ctypes.string_at(0)  # a native crash: SIGSEGV
        return super().generate(request)


class Sleeps(StandardDecoder):
    calls = 0

    def generate(self, request):
        self.calls += 1
        if self.calls == 2:
            time.sleep(10 ** 6)  # a hang
        return super().generate(request)
'''
BROKEN_LINE = next(i for i, line in enumerate(USER_DECODERS.splitlines(), 1) if "BROKEN LINE" in line)
SLEEP_LINE = next(i for i, line in enumerate(USER_DECODERS.splitlines(), 1) if "time.sleep(10 ** 6)" in line)


@pytest.fixture
def user_decoders(tmp_path, monkeypatch):
    (tmp_path / "userdec.py").write_text(USER_DECODERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("userdec", None)


def _config(root: Path, candidates: dict) -> Path:
    """Four items, greedy, seed 0: the standard baseline and the given candidates (name: decoder)."""
    suite = root / "s.jsonl"
    rows = [{"suite": "s", "version": "1", "description": "broken-candidate suite", "smoke": list("abcd"),
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}}]
    rows += [{"id": i, "prompt": p, "references": ["zz"]}
             for i, p in zip("abcd", ("hello there", "good morning", "tell me", "one two"))]
    suite.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cands = "".join(f'[[candidates]]\nname = "{n}"\ndecoder = "{d}"\n' for n, d in candidates.items())
    cfg = root / "c.toml"
    cfg.write_text(f'target = "tiny-llama"\n[baseline]\nname = "baseline"\ndecoder = "standard"\n{cands}[suites.s]\npath = "{suite}"\n'
                   f'[profiles.smoke]\nsubset = "smoke"\nsuites = ["s"]\ntemperatures = [0.0]\nseeds = [0]\n')
    return cfg


def _regress(cfg: Path, run_dir: Path, *extra: str) -> tuple[int, dict]:
    tracking = [] if "--tracking-uri" in extra else ["--no-tracking"]
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", *tracking, *extra])
    return code, json.loads((run_dir / "summary.json").read_text())


def _failed(summary: dict, name: str) -> dict:
    cand = summary["candidates"][name]
    assert cand["verdict"] == "fail"
    return {g["name"]: g["detail"] for g in cand["gates"] if g["status"] == "fail"}


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]


def _child(cfg: Path, run_dir: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cfg.parent)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "harness.cli", "regress", "--config", str(cfg), "--run-dir",
                           str(run_dir), "--no-tracking", "--no-progress", *extra],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_a_candidate_that_raises_fails_and_the_others_are_judged(user_decoders, tmp_path, mlflow_sqlite):
    cfg = _config(tmp_path, {"mine": "userdec:Broken", "fine": "standard"})
    run_dir = tmp_path / "run"
    md, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
    uri = mlflow_sqlite
    code, summary = _regress(cfg, run_dir, "--summary-md", str(md), "--junit-xml", str(junit), "--tracking-uri", uri)
    line = f"mine: raised IndexError on s/c (T=0, seed 0) at userdec.py:{BROKEN_LINE}; 2 of 4 items ran"
    assert code == 1  # the gate's, not 3: the bug is the candidate's
    assert summary["candidates"]["fine"]["verdict"] == "pass"
    assert _failed(summary, "mine")["raised"] == line
    for out in (md, junit, run_dir / "report.md"):  # CI's files and MLflow's run description
        assert line in out.read_text()
    from mlflow import MlflowClient
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    mine = next(r for r in runs if r.data.tags.get("decodegate.candidate") == "mine")
    assert line in mine.data.tags["mlflow.note.content"] and mine.data.metrics["verdict_pass"] == 0
    by = {}
    for r in _rows(run_dir):
        by.setdefault(r["candidate"], []).append(r["item_id"])
    assert by == {"baseline": list("abcd"), "fine": list("abcd"), "mine": ["a", "b"]}
    stop = json.loads((run_dir / "stops.jsonl").read_text())
    assert (stop["item"], stop["seed"], stop["temperature"], stop["exception"]) == ("s/c", 0, 0.0, "IndexError")
    trace = (run_dir / stop["traceback"]).read_text()
    assert line in trace and "IndexError: list index out of range" in trace and "userdec.py" in trace
    # The next run on the folder: the same verdict, without running it again.
    code, again = _regress(cfg, run_dir)
    assert code == 1 and _failed(again, "mine")["raised"] == line and len(_rows(run_dir)) == 10


def test_a_fixed_candidate_runs_again_on_the_same_folder(user_decoders, tmp_path, capsys):
    cfg = _config(tmp_path, {"mine": "userdec:Broken", "fine": "standard"})
    run_dir = tmp_path / "run"
    assert _regress(cfg, run_dir)[0] == 1
    code, again = _regress(cfg, run_dir)
    assert "mine: left out of this run (mine: raised IndexError" in capsys.readouterr().err
    fixed = tmp_path / "userdec.py"
    fixed.write_text(fixed.read_text().replace("if self.calls == 3:", "if self.calls == -1:"))
    sys.modules.pop("userdec", None)  # the fixed code, as a new process would import it
    code, summary = _regress(cfg, run_dir)
    assert "mine: changed since it broke (mine code " in capsys.readouterr().err
    assert code == 0 and summary["candidates"]["mine"]["verdict"] == "pass"
    assert len([r for r in _rows(run_dir) if r["candidate"] == "mine"]) == 4


def test_a_baseline_that_raises_stops_the_run_naming_it(user_decoders, tmp_path, capsys):
    cfg = _config(tmp_path, {"fine": "standard"})
    cfg.write_text(cfg.read_text().replace('decoder = "standard"\n[[cand', 'decoder = "userdec:Broken"\n[[cand', 1))
    run_dir = tmp_path / "run"
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"baseline: raised IndexError on s/c (T=0, seed 0) at userdec.py:{BROKEN_LINE}" in err
    assert len([r for r in _rows(run_dir) if r["candidate"] == "baseline"]) == 2  # the rows are kept


def test_garbage_fails_each_item_with_its_cause(user_decoders, tmp_path):
    cfg = _config(tmp_path, {"nan": "userdec:NaNMargins", "oov": "userdec:OutOfVocabulary", "fine": "standard"})
    code, summary = _regress(cfg, tmp_path / "run")
    assert code == 1 and summary["candidates"]["fine"]["verdict"] == "pass"
    assert "4 generation(s) failed" in _failed(summary, "nan")["errors"]
    assert "margin nan at position 0 (NaN or infinite logits)" in _failed(summary, "nan")["errors"]
    assert "token id 1000000 at position 0 is outside the vocabulary" in _failed(summary, "oov")["errors"]
    rows = [r for r in _rows(tmp_path / "run") if r["candidate"] in ("nan", "oov")]
    assert len(rows) == 8 and all(r["error"] and not r["passed"] for r in rows)


@pytest.mark.full  # a child regress (~30 s)
def test_a_segfault_is_named_in_the_same_run_and_remembered(user_decoders, tmp_path, capsys):
    """The decoder's worker dies; the parent names it, judges the others and exits 1 (before
    issue 57 the whole run died with SIGSEGV and only the next run named it)."""
    cfg = _config(tmp_path, {"crashy": "userdec:Segfaults", "fine": "standard"})
    run_dir = tmp_path / "run"
    child = _child(cfg, run_dir)
    line = "crashy: crashed on s/b (T=0, seed 0): killed by SIGSEGV; 1 of 4 items ran"
    assert child.returncode == 1, child.stderr[-3000:]
    assert line in child.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["candidates"]["fine"]["verdict"] == "pass"
    assert _failed(summary, "crashy")["crashed"].startswith(line)
    trace = (run_dir / "tracebacks" / "crashy.txt").read_text()
    assert "Segmentation fault" in trace and "userdec.py" in trace  # faulthandler's Python stack, in the worker
    code, again = _regress(cfg, run_dir)  # remembered: not run again, the same FAIL
    assert code == 1 and _failed(again, "crashy")["crashed"].startswith(line)
    assert "crashy: left out of this run" in capsys.readouterr().err
    assert not (run_dir / "inflight.json").exists()


@pytest.mark.full  # a child regress (~30 s)
def test_a_hang_ends_within_the_bound_and_the_others_are_judged(user_decoders, tmp_path, capsys):
    cfg = _config(tmp_path, {"sleepy": "userdec:Sleeps", "fine": "standard"})
    run_dir = tmp_path / "run"
    start = time.monotonic()
    child = _child(cfg, run_dir, "--item-timeout", "3", timeout=300)
    took = time.monotonic() - start
    assert child.returncode == 1, child.stderr[-3000:]
    assert "sleepy: hung on s/b (T=0, seed 0): no result after 3 s" in child.stderr
    # The worker's Python stack, as faulthandler dumps it (file, line, function; no source text).
    assert f'userdec.py", line {SLEEP_LINE} in generate' in child.stderr, child.stderr[-3000:]
    assert took < 3 + 120  # model building and item "a" around the 3 s bound, not 10**6 s
    assert {r["candidate"] for r in _rows(run_dir)} == {"baseline", "fine", "sleepy"}  # rows before it kept
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["candidates"]["fine"]["verdict"] == "pass" and "hung on s/b" in _failed(summary, "sleepy")["hung"]
    code, again = _regress(cfg, run_dir)
    assert code == 1 and "hung on s/b" in _failed(again, "sleepy")["hung"]
    assert f"line {SLEEP_LINE} in generate" in (run_dir / "tracebacks" / "sleepy.txt").read_text()


def test_the_item_limit():
    # No baseline time and no --item-timeout: bounded all the same (a hung baseline held the run)
    assert item_limit(Policy(), None) == UNKNOWN_ITEM_LIMIT_S
    assert item_limit(Policy(), 0.5) == HANG_FLOOR_S  # 20 x 0.5 s is below the floor
    assert item_limit(Policy(hang_factor=20), 10.0) == 200.0
    assert item_limit(Policy(item_timeout=5.0), 10.0) == 5.0
    assert item_limit(Policy(item_timeout=5.0), None) == 5.0


def test_whose_code_raised(user_decoders):
    """Exit 3's line says whose code raised, from the traceback: decodegate's, or code outside it."""
    from harness.run.records import record_key
    with pytest.raises(KeyError) as ours:
        record_key({})
    assert whose(ours.value).startswith("a bug in decodegate, at harness/run/records.py:")
    import userdec
    with pytest.raises(IndexError) as theirs:
        userdec.Broken.generate(type("Three", (), {"calls": 2})(), None)
    assert whose(theirs.value) == f"raised by code outside decodegate, at userdec.py:{BROKEN_LINE}"


def test_keep_going_runs_the_other_items(user_decoders, tmp_path):
    cfg = _config(tmp_path, {"mine": "userdec:Broken"})
    code, summary = _regress(cfg, tmp_path / "run", "--keep-going")
    mine = [r for r in _rows(tmp_path / "run") if r["candidate"] == "mine"]
    assert code == 1 and [r["item_id"] for r in mine] == list("abcd")  # d ran after c raised
    assert mine[2]["error"].startswith("mine: raised IndexError on s/c (T=0, seed 0) at userdec.py:")
    assert "1 generation(s) failed; first: c: mine: raised IndexError" in _failed(summary, "mine")["errors"]
