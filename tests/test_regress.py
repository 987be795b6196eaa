"""End to end `decodegate regress` on tiny models: gates pass and fail for the right reasons,
runs resume without repeating work, and a tracking server that is down loses nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decoders import GenerationRequest, make_decoder
from harness.models import load_model
from helpers import free_port, mlflow_server, regress, spec_candidate, summary, write_regress_config

N_ITEMS = 40
PROMPTS = [f"Item {i}: tell me about {w}" for i, w in
           enumerate(["cats", "rivers", "stars", "bread", "music", "trains", "maps", "clouds"] * 5)]


@pytest.fixture(scope="module")
def tiny_suite(tmp_path_factory):
    """A suite the tiny model can 'pass': each reference is the baseline's own greedy output,
    so exact candidates keep a 100% pass rate and a decoder that changes outputs loses it."""
    target = load_model("tiny-llama")
    dec = make_decoder("standard", target)
    folder = tmp_path_factory.mktemp("suite")
    rows = [{"suite": "echo", "version": "1", "description": "tiny-model echo suite for tests",
             "smoke": [f"e{i}" for i in range(N_ITEMS)],
             "defaults": {"grader": "contains", "max_new_tokens": 12, "stop": []}}]
    for i, prompt in enumerate(PROMPTS[:N_ITEMS]):
        text = dec.generate(GenerationRequest(tuple(target.encode(prompt)), max_new_tokens=12,
                                              stop_token_ids=target.stop_token_ids())).text
        ref = " ".join(text.split()) or "\u0000never"
        rows.append({"id": f"e{i}", "prompt": prompt, "references": [ref],
                     "grader_options": {"case_sensitive": True}, "categories": ["echo"]})
    path = folder / "echo.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def write_config(tmp_path: Path, suite: Path, candidates: str, *, temps="[0.0, 0.8]", samples=300) -> Path:
    return write_regress_config(tmp_path / "regress.toml", head={"top_p": 0.9}, candidates=candidates,
                                suites={"echo": {"margin": 0.2, "path": str(suite)}},
                                profile={"subset": "smoke", "suites": ["echo"], "temperatures": json.loads(temps),
                                         "sample_suites": ["echo"], "seeds": [0], "exactness_prompts": 1,
                                         "exactness_samples": samples})


SPEC = """
[[candidates]]
name = "spec-self"
decoder = "speculative"
options = {{ draft = "tiny-llama", k = 3, verify = "coupled" }}
[[candidates]]
name = "spec-rejection"
decoder = "speculative"
options = {{ draft = "tiny-qwen2", k = 2, verify = "rejection" }}
""".replace("{{", "{").replace("}}", "}")


def test_exact_candidates_pass(tmp_path, tiny_suite):
    cfg = write_config(tmp_path, tiny_suite, SPEC)
    assert regress(cfg, tmp_path / "run") == 0
    s = summary(tmp_path / "run")
    assert s["verdict"] == "pass"
    spec = s["candidates"]["spec-self"]
    assert spec["suites"]["echo"]["identity"]["T=0"]["rate"] == 1.0
    assert spec["suites"]["echo"]["identity"]["T=0.8"]["rate"] == 1.0   # coupled: identical when sampled
    assert spec["suites"]["echo"]["quality_identical"] == N_ITEMS  # identical outputs, identical grades
    rej = s["candidates"]["spec-rejection"]
    assert rej["exactness"]["tests"][0]["pvalue"] >= 0.001
    names = {g["name"] for g in rej["gates"]}
    assert any(n.startswith("exactness") for n in names)
    for f in ("records.jsonl", "per_prompt.csv", "report.txt", "summary.json"):
        assert (tmp_path / "run" / f).exists()


def test_broken_verifier_fails_the_identity_gate(tmp_path, tiny_suite, broken_greedy_verifier, capsys):
    cfg = write_config(tmp_path, tiny_suite, """
[[candidates]]
name = "spec-broken"
decoder = "speculative"
options = { draft = "tiny-qwen2", k = 3 }
""", temps="[0.0]")
    assert regress(cfg, tmp_path / "run") == 1
    out = capsys.readouterr().out
    assert "identity echo T=0" in out and "real divergence" in out
    failed = [g for g in summary(tmp_path / "run")["candidates"]["spec-broken"]["gates"] if g["status"] == "fail"]
    assert any(g["name"] == "identity echo T=0" for g in failed)


def test_early_exit_at_threshold_zero_fails_quality(tmp_path, tiny_suite):
    cfg = write_config(tmp_path, tiny_suite, """
[[candidates]]
name = "ee-0"
decoder = "early-exit"
kind = "lossy"
options = { threshold = 0.0 }
""", temps="[0.0]")
    assert regress(cfg, tmp_path / "run") == 1
    cand = summary(tmp_path / "run")["candidates"]["ee-0"]
    failed = {g["name"] for g in cand["gates"] if g["status"] == "fail"}
    assert "quality echo" in failed
    assert cand["exits"]["mean_layers"] < cand["exits"]["num_layers"]


def _cli(*args, env=None):
    return [sys.executable, "-m", "harness.cli", *args]


def _stable(s: dict) -> dict:
    """The parts of a summary that do not depend on timing."""
    return {n: {"verdict": c["verdict"], "gates": [(g["name"], g["status"]) for g in c["gates"]],
                "identity": {k: v["identity"] for k, v in c["suites"].items()},
                "quality": {k: v.get("quality", {}).get("statistic") for k, v in c["suites"].items()}}
            for n, c in s["candidates"].items()}


# `full`: a child regress killed halfway, then two more runs (23 s of a quiet `make check`).
# `make check` keeps resuming a folder: the fault matrix's slice (a killed worker, every row kept on
# the rerun), tests/test_decoder_faults.py (the windows still missing) and test_baseline_reuse.py
# (a run stopped by its looks).
@pytest.mark.full
def test_resume_after_kill_runs_nothing_twice(tmp_path, tiny_suite):
    cfg = write_config(tmp_path, tiny_suite, SPEC, samples=100)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    args = _cli("regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", "--no-tracking")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    records = run_dir / "records.jsonl"
    deadline = time.time() + 300  # generous: CI machines may be loaded
    while time.time() < deadline:
        if records.exists() and records.read_text().count("\n") >= 60:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    half = records.read_text().count("\n")
    assert 60 <= half < 240, "the run should have been killed halfway"
    assert not (run_dir / "summary.json").exists()
    assert regress(cfg, run_dir) == 0
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    keys = [(r["candidate"], r["suite"], r["item_id"], r["seed"], r["temperature"]) for r in rows]
    assert len(keys) == len(set(keys)) == N_ITEMS * 2 * 3  # 3 decoders x 2 temperatures
    first = _stable(summary(run_dir))
    assert regress(cfg, run_dir) == 0  # a third run: nothing left to do, the same answer
    assert _stable(summary(run_dir)) == first
    assert len(records.read_text().splitlines()) == len(keys)


# `full`: a real MLflow server and three CLI processes, the slowest test `make check` had (57 s of
# 437 on a quiet Zen 3); it checks review, not a verdict. The tracking-down path (one line, the
# run kept, exit 0) stays in `make check`: tests/test_bad_input.py.
@pytest.mark.full
def test_tracking_down_then_sync(tmp_path, tiny_suite):
    cfg = write_config(tmp_path, tiny_suite, SPEC, temps="[0.0]", samples=50)
    run_dir = tmp_path / "run"
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    t0 = time.time()
    out = subprocess.run(_cli("regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress",
                              "--tracking-uri", uri), capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not reachable" in out.stderr and "decodegate sync" in out.stderr
    assert time.time() - t0 < 120
    assert (run_dir / "summary.json").exists() and not (run_dir / "tracking.json").exists()

    with mlflow_server(tmp_path, port):
        for _ in range(2):  # twice: the second sync must not duplicate runs
            res = subprocess.run(_cli("sync", str(run_dir), "--tracking-uri", uri), capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
            assert res.returncode == 0, res.stderr[-2000:]
        from mlflow import MlflowClient
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("decodegate-regress")
        runs = client.search_runs([exp.experiment_id])
        assert len(runs) == 3  # parent + two candidates
        child = next(r for r in runs if r.info.run_name == "spec-self")
        assert child.data.tags["optimization"] == "speculative"
        assert child.data.tags["label.team"] if "label.team" in child.data.tags else True
        assert "speedup" in child.data.metrics and "echo.identity.T_0" in child.data.metrics


def test_lmeval_task_as_a_regress_suite(tmp_path):
    """An lm-eval task listed as `lmeval:<task>` is paired and analysed like any suite."""
    include = Path(__file__).parent / "data" / "lmeval"
    cfg = write_regress_config(tmp_path / "regress.toml", candidates=spec_candidate('{ draft = "tiny-llama", k = 3 }',
                                                                                    name="spec-self"),
                               suites={"lmeval:decodegate_tiny_gen": {"include_path": str(include)}},
                               profile={"subset": "smoke", "suites": ["lmeval:decodegate_tiny_gen"],
                                        "temperatures": [0.0]})
    assert regress(cfg, tmp_path / "run") == 0
    s = summary(tmp_path / "run")
    ident = s["candidates"]["spec-self"]["suites"]["lmeval:decodegate_tiny_gen"]["identity"]["T=0"]
    assert ident["n"] >= 3 and ident["rate"] == 1.0
    assert s["suites"]["lmeval:decodegate_tiny_gen"]["hash"] not in ("?", None)


# `full`: tests/test_exactness_gates.py catches broken rejection verifiers end to end in `make
# check`, on a target where drafts are likely (on this random tiny model they rarely are).
@pytest.mark.full
def test_broken_rejection_verifier_fails_the_exactness_gate(tmp_path, tiny_suite, monkeypatch):
    import decoders.speculative as spec
    from decoders.verify import Verdict

    def accept_all(p, q, draft, u_accept, u_sample):  # the bug: outputs follow the draft, not the target
        k = draft.shape[1]
        return Verdict(accepted=draft.new_full((draft.shape[0],), k),
                       token=p[:, k].argmax(-1))

    monkeypatch.setattr(spec, "verify_rejection", accept_all)
    cfg = write_config(tmp_path, tiny_suite, """
[[candidates]]
name = "spec-rejection"
decoder = "speculative"
suites = ["echo"]
options = { draft = "tiny-qwen2", k = 2, verify = "rejection" }
""", temps="[0.8]", samples=300)
    assert regress(cfg, tmp_path / "run") == 1
    gates = summary(tmp_path / "run")["candidates"]["spec-rejection"]["gates"]
    failed = [g for g in gates if g["status"] == "fail"]
    assert any(g["name"].startswith("exactness") and "p=" in g["detail"] for g in failed), failed
