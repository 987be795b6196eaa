"""The acceptance regression gate end to end on tiny models: a reference run with a perfect draft
(the target itself), then the same candidate with a worse draft must fail, a rerun of the same
candidate must pass, and a reference on other prompts or another target is refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.acceptance_drift import acceptance_drift
from harness.cli import main
from helpers import regress, spec_candidate, summary, write_regress_config

PROMPTS = [f"Note {i}: {w} and {v}" for i, (w, v) in enumerate(
    zip(["cats", "rivers", "stars", "bread", "music", "trains", "maps", "clouds"] * 2,
        ["dogs", "lakes", "moons", "salt", "songs", "roads", "books", "rain"] * 2))]


def write_suite(path: Path, prompts=PROMPTS, version="1") -> Path:
    rows = [{"suite": "notes", "version": version, "description": "tiny acceptance-gate suite",
             "smoke": [f"n{i}" for i in range(len(prompts))],
             "defaults": {"grader": "none", "max_new_tokens": 16, "stop": []}}]
    rows += [{"id": f"n{i}", "prompt": p, "categories": ["even" if i % 2 == 0 else "odd"]}
             for i, p in enumerate(prompts)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def write_config(folder: Path, suite: Path, draft: str, reference: str | None = None, target="tiny-llama") -> Path:
    ref = f'acceptance_reference = "{reference}"\nacceptance_tolerance = 0.05' if reference else ""
    cfg = folder / f"regress-{draft.replace(':', '')}-{bool(reference)}.toml"
    write_regress_config(cfg, target=target, candidates=spec_candidate(f'{{ draft = "{draft}", k = 3 }}') + ref,
                         suites={"notes": {"path": str(suite)}},
                         profile={"subset": "smoke", "suites": ["notes"], "temperatures": [0.0], "seeds": [0]})
    return cfg


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("acc")
    suite = write_suite(folder / "notes.jsonl")
    run = folder / "ref"
    assert regress(write_config(folder, suite, "tiny-llama"), run) == 0
    return folder, suite, run


@pytest.mark.full  # a reference run and two regresses (7 s); the drift gate's statistics stay quick below
def test_worse_draft_fails_and_rerun_passes(reference, capsys):
    folder, suite, ref_run = reference
    alpha_ref = summary(ref_run)["candidates"]["spec"]["acceptance"]["alpha"]
    assert alpha_ref == 1.0  # the target drafting for itself

    # The draft swapped for another model: α collapses, the gate fails (identity still holds).
    worse = folder / "worse"
    assert regress(write_config(folder, suite, "tiny-qwen2", str(ref_run)), worse) == 1
    cand = summary(worse)["candidates"]["spec"]
    failed = [g for g in cand["gates"] if g["status"] == "fail"]
    assert {g["name"] for g in failed} >= {"acceptance all alpha", "acceptance all tau"}
    assert all(g["name"].startswith("acceptance") for g in failed)  # only the acceptance gate fails
    drift = cand["acceptance_drift"]
    overall = next(c for c in drift["comparisons"] if c["group"] == "all" and c["quantity"] == "alpha")
    assert overall["candidate"] < 0.5 and overall["upper_bound"] < -0.05
    assert {c["group"] for c in drift["comparisons"]} == {"all", "category:even", "category:odd"}
    assert [c["quantity"] for c in drift["by_position"]] == ["alpha@0", "alpha@1", "alpha@2"]
    assert "acceptance of spec vs" in (worse / "report.txt").read_text()

    # The same candidate again: identical acceptance, the gate passes.
    again = folder / "again"
    assert regress(write_config(folder, suite, "tiny-llama", str(ref_run)), again) == 0
    gates = {g["name"]: g["status"] for g in summary(again)["candidates"]["spec"]["gates"]}
    assert gates["acceptance all alpha"] == "pass" and gates["acceptance all tau"] == "pass"


def test_reference_on_other_prompts_or_target_is_refused(reference, capsys, tmp_path):
    folder, _, ref_run = reference
    other = write_suite(tmp_path / "notes.jsonl", PROMPTS[:-1] + ["Note 15: a changed prompt"], version="2")
    assert regress(write_config(tmp_path, other, "tiny-llama", str(ref_run)), tmp_path / "r1") == 2
    err = capsys.readouterr().err
    ref_hash = summary(ref_run)["suites"]["notes"]["hash"][:12]
    assert "suite 'notes'" in err and ref_hash in err
    assert not (tmp_path / "r1" / "records.jsonl").exists()  # refused before generating anything
    assert regress(write_config(tmp_path, folder / "notes.jsonl", "tiny-qwen2", str(ref_run), target="tiny-qwen2"),
                   tmp_path / "r2") == 2
    err = capsys.readouterr().err
    assert "'tiny-llama'" in err and "'tiny-qwen2'" in err


def _row(item, accepted, proposed, category="c"):
    tokens = sum(accepted) + len(accepted)
    return {"candidate": "spec", "suite": "s", "item_id": item, "seed": 0, "temperature": 0.0, "categories": [category],
            "tokens": [0] * tokens, "stats": {"accepted_per_round": accepted, "proposed_per_round": proposed,
                                              "target_forwards": len(accepted) + 1}}


def test_drift_statistic_small_drop_within_tolerance_passes_large_fails():
    ref = [_row(f"i{i}", [3, 3, 2, 3], [3, 3, 3, 3]) for i in range(30)]
    same = [_row(f"i{i}", [3, 3, 2, 3], [3, 3, 3, 3]) for i in range(30)]
    r = acceptance_drift(ref, same, tolerance=0.05, rng=0)
    assert r.passed and all(c.relative_change == 0 for c in r.comparisons)
    slight = [_row(f"i{i}", [3, 3, 2, 3] if i % 10 else [3, 2, 2, 3], [3, 3, 3, 3]) for i in range(30)]
    assert acceptance_drift(ref, slight, tolerance=0.05, rng=0).passed  # a ~2% drop is tolerated
    bad = [_row(f"i{i}", [1, 0, 2, 1], [3, 3, 3, 3]) for i in range(30)]
    r = acceptance_drift(ref, bad, tolerance=0.05, rng=0)
    assert not r.passed and {c.quantity for c in r.regressions} == {"alpha", "tau"}
    with pytest.raises(ValueError, match="share no prompt"):
        acceptance_drift(ref, [_row("other", [1], [3])], rng=0)


def test_a_drafter_that_stops_proposing_is_not_left_ungated():
    """The reference drafted in 120 rounds, the candidate (prompt lookup finding no match, a
    drafter that broke) in none on the same prompts: the gate said "not gated" and the run passed."""
    from harness.config import Gates
    from harness.verdict.gate import decide
    from harness.verdict.plain import plain
    ref = [_row(f"i{i}", [3, 3, 2, 3], [3, 3, 3, 3]) for i in range(30)]
    silent = [_row(f"i{i}", [0] * 12, [0] * 12) for i in range(30)]
    drift = {"reference": "runs/ref", **plain(acceptance_drift(ref, silent, tolerance=0.05, rng=0))}
    cand = {"kind": "exact", "decoder": "speculative", "options": {"verify": "coupled"}, "acceptance_drift": drift,
            "suites": {"s": {"identity": {"T=0": {"n": 30, "identical": 30, "near_ties": 0, "divergences": []}}}}}
    d = decide(cand, Gates())
    failed = {r.name: r.detail for r in d.results if r.status == "fail"}
    assert not d.passed and {"acceptance all alpha", "acceptance all tau"} <= set(failed)
    assert "drafted in 0 round(s) where the reference runs/ref drafted in 120" in failed["acceptance all tau"]
    assert decide(cand, Gates(inconclusive="warn")).passed  # inconclusive, not worse


def test_a_quantity_that_cannot_be_computed_with_enough_rounds_is_not_dropped():
    """Candidate records without the target's forward count (a custom backend, another version):
    τ had no interval, was "not gated", and only α was printed; the run passed."""
    from harness.config import Gates
    from harness.verdict.gate import decide
    from harness.verdict.plain import plain
    ref = [_row(f"i{i}", [3, 3, 2, 3], [3, 3, 3, 3]) for i in range(30)]
    blind = [_row(f"i{i}", [3, 3, 2, 3], [3, 3, 3, 3]) for i in range(30)]
    for r in blind:
        del r["stats"]["target_forwards"]
    drift = {"reference": "runs/ref", **plain(acceptance_drift(ref, blind, tolerance=0.05, rng=0))}
    cand = {"kind": "exact", "decoder": "speculative", "options": {"verify": "coupled"}, "acceptance_drift": drift,
            "suites": {"s": {"identity": {"T=0": {"n": 30, "identical": 30, "near_ties": 0, "divergences": []}}}}}
    d = decide(cand, Gates())
    failed = {r.name: r.detail for r in d.results if r.status == "fail"}
    assert not d.passed and "acceptance all tau" in failed and "acceptance all alpha" not in failed
    assert "candidate not computable" in failed["acceptance all tau"] and "target forwards" in failed["acceptance all tau"]


# `full`: two runs logged to MLflow and read back (21 s of a quiet `make check`); the drift gate
# stays in `make check` with a run folder as the reference, and `mlflow:last` read once before the
# run in the next test.
@pytest.mark.full
def test_mlflow_last_reference_and_log_text_false(reference, tmp_path, capsys, mlflow_sqlite):
    from harness.run import tracking
    folder, suite, ref_run = reference
    uri = mlflow_sqlite
    tracking.log_run(ref_run, uri)  # the passing reference, now in MLflow
    cfg = write_config(tmp_path, suite, "tiny-qwen2", "mlflow:last")
    cfg.write_text("log_text = false\n" + cfg.read_text())
    run = tmp_path / "worse"
    assert main(["regress", "--config", str(cfg), "--run-dir", str(run), "--no-progress", "--tracking-uri", uri]) == 1
    cand = summary(run)["candidates"]["spec"]
    ids = json.loads((ref_run / "tracking.json").read_text())["runs"]
    assert cand["acceptance_drift"]["reference"] == f"mlflow:{ids['spec']}"
    assert any(g["name"] == "acceptance all alpha" and g["status"] == "fail" for g in cand["gates"])
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    mine = json.loads((run / "tracking.json").read_text())["runs"]
    names = {a.path for a in client.list_artifacts(mine["parent"])}
    assert "summary.json" in names and "records.jsonl" not in names  # text stayed in the run folder
    assert (run / "records.jsonl").exists()
    assert {a.path for a in client.list_artifacts(ids["parent"])} >= {"records.jsonl"}  # the default logs it
    # The failed run is no reference: mlflow:last still finds the passing one.
    assert tracking.last_passing_reference(uri, "spec", "tiny-llama", cand["acceptance_suites_key"])["source"] \
        == f"mlflow:{ids['spec']}"
    assert tracking.last_passing_reference(uri, "spec", "tiny-llama", "0" * 16) is None


@pytest.mark.full  # a reference logged to MLflow, then a regress (14 s); the drift gate stays quick above
def test_a_tracking_server_that_goes_down_during_the_run_costs_no_verdict(reference, tmp_path, monkeypatch,
                                                                          mlflow_sqlite):
    """`mlflow:last` is read before the run; once generation is done the server may be gone. The
    reference read at the start is the one compared, and every output is written (before: the
    reference was fetched again at the end, and a server down then cost the summary, the report and
    the JUnit file, with exit 3)."""
    from harness.run import tracking
    folder, suite, ref_run = reference
    uri = mlflow_sqlite
    tracking.log_run(ref_run, uri)
    found = tracking.last_passing_reference
    calls = []

    def once_then_down(*a, **kw):
        calls.append(a)
        if len(calls) > 1:
            raise tracking.TrackingUnavailable(f"tracking server {uri} is not reachable (stopped)")
        return found(*a, **kw)

    monkeypatch.setattr(tracking, "last_passing_reference", once_then_down)
    cfg = write_config(tmp_path, suite, "tiny-qwen2", "mlflow:last")
    run = tmp_path / "worse"
    junit = tmp_path / "junit.xml"
    assert main(["regress", "--config", str(cfg), "--run-dir", str(run), "--no-progress", "--no-tracking",
                 "--tracking-uri", uri, "--junit-xml", str(junit)]) == 1
    cand = summary(run)["candidates"]["spec"]
    assert cand["acceptance_drift"]["reference"].startswith("mlflow:") and junit.exists()
    assert any(g["name"] == "acceptance all alpha" and g["status"] == "fail" for g in cand["gates"])
    assert len(calls) == 1


def _gates(ref, cand, **kw):
    from harness.config import Gates
    from harness.verdict.gate import _acceptance_gates
    from harness.verdict.plain import plain
    r = acceptance_drift(ref, cand, tolerance=0.05, rng=0)
    return r, {g.name: g for g in _acceptance_gates({"acceptance_drift": {"reference": "runs/ref", **plain(r)}},
                                                    Gates(**kw))}


def test_a_drift_over_fewer_than_five_prompts_is_inconclusive():
    """One prompt: the bootstrap over prompts has one cluster, its 'interval' is the point estimate, and
    an unchanged drafter was 'regressed' in 72 of 200 runs (red-team); the same comparison could pass."""
    ref = [_row("i0", [3, 3, 2, 3] * 8, [3] * 32)]
    drop = [_row("i0", [2, 3, 2, 2] * 8, [3] * 32)]   # noise on one prompt, or a drop: one prompt cannot say
    r, gates = _gates(ref, drop)
    assert r.passed and not any(c.gated for c in r.comparisons)
    for q in ("alpha", "tau"):
        g = gates[f"acceptance all {q}"]
        assert g.status == "fail" and g.detail.startswith("inconclusive") and "at least 5 paired prompts" in g.detail
    _, same = _gates(ref, ref, inconclusive="warn")
    assert {g.status for g in same.values()} == {"warn"}  # not "pass" from one prompt
    # five prompts: gated as before
    ref5 = [_row(f"i{i}", [3, 3, 2, 3] * 8, [3] * 32) for i in range(5)]
    r, gates = _gates(ref5, ref5)
    assert all(c.gated for c in r.comparisons) and gates["acceptance all alpha"].status == "pass"


def test_impossible_acceptance_counters_are_refused():
    """6 accepted of 4 proposed per round, 300 tokens from one target forward: 'tau 2.000 -> 300.000
    pass' (red-team). analysis.acceptance refuses such rows; so does the drift."""
    ref = [_row(f"i{i}", [2, 1, 3, 0, 4] * 6, [4] * 30) for i in range(8)]
    bad = [_row(f"i{i}", [6] * 30, [4] * 30) for i in range(8)]
    with pytest.raises(ValueError, match=r"8 candidate record\(s\) with impossible acceptance counters; first: "
                                         r"record s/i0 .*accepted 6 of 4 proposed in round 0"):
        acceptance_drift(ref, bad, rng=0)
    negative = [_row(f"i{i}", [2, -1, 3, 0, 4] * 6, [4] * 30) for i in range(8)]
    with pytest.raises(ValueError, match="reference record"):
        acceptance_drift(negative, ref, rng=0)
    with pytest.raises(ValueError, match="impossible"):
        acceptance_drift(ref, [_row("i0", [1, 1], [2, 2, 2])], rng=0)
