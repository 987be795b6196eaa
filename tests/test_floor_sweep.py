"""The A/A nondeterminism floor and concurrency sweeps: the floor statistics on constructed
identity blocks (a candidate within the floor passes, one beyond it fails, a zero floor is
strict identity), and a real llama.cpp sweep through `regress`."""
from __future__ import annotations

import json

import pytest

from harness.verdict import floor
from harness.verdict.gate import _identity_gates


def block(n: int, diverged: list[int], kind: str = "real") -> dict:
    divs = [{"item_id": f"p{i}", "seed": 0, "temperature": 0.0, "position": 3, "margin": 0.5, "kind": kind,
             "baseline_token": 1, "candidate_token": 2} for i in diverged]
    return {"rate": 1 - len(diverged) / n, "n": n, "identical": n - len(diverged), "divergences": divs,
            "near_ties": 0, "real_divergences": len(divs)}


def cand_with(ident: dict) -> dict:
    return {"kind": "exact", "suites": {"s": {"identity": {"T=0": ident}}}}


def test_candidate_within_a_nonzero_floor_passes():
    aa = block(40, [1, 2, 3, 4, 5, 6])            # the engine disagrees with itself on 6/40
    cand = block(40, [1, 2, 3, 7, 8, 9])          # 3 shared, 3 of its own: no more than the floor
    f = cand["floor"] = floor.compare(cand, aa, alpha=0.05)
    assert f["rate"] == pytest.approx(0.15) and not f["exceeds"]
    assert cand["within_floor"] == 3 and cand["real_divergences"] == 3
    [g] = _identity_gates(cand_with(cand), check_sampled=False)
    assert g.status == "pass" and "within the floor" in g.detail


def test_candidate_beyond_the_floor_fails():
    aa = block(40, [1, 2])
    broken = block(40, list(range(1, 21)))        # half the prompts move: a lossy decoder called exact
    f = broken["floor"] = floor.compare(broken, aa, alpha=0.05)
    assert f["exceeds"] and f["pvalue"] < 1e-4 and f["difference_lower_bound"] > 0.2
    [g] = _identity_gates(cand_with(broken), check_sampled=False)
    assert g.status == "fail" and "more than the floor" in g.detail


def test_zero_floor_is_strict_identity():
    aa = block(40, [])
    one = block(40, [5])
    one["floor"] = floor.compare(one, aa, alpha=0.05)
    [g] = _identity_gates(cand_with(one), check_sampled=False)
    assert g.status == "fail" and "1 real divergence" in g.detail
    tie = block(40, [5], kind="near-tie")
    tie["floor"] = floor.compare(tie, aa, alpha=0.05)
    assert _identity_gates(cand_with(tie), check_sampled=False)[0].status == "pass"


@pytest.mark.slow
def test_sweep_through_regress_on_llama_cpp(tmp_path):
    from harness.cli import main
    from test_engines import engine_config, launch_args, write_suite
    suite = write_suite(tmp_path, n=4)
    ngram = launch_args("-np", "2", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                        "--spec-ngram-simple-size-m", "8")
    cfg = engine_config(tmp_path, suite, {"plain": launch_args("-np", "2", "--spec-type", "none"), "ngram": ngram},
                        [("ngram", "ngram")])
    cfg.write_text(cfg.read_text().replace('seeds = [0]\n', 'seeds = [0]\nconcurrency = [1, 2]\n'))
    run_dir = tmp_path / "run"
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"])
    summary = json.loads((run_dir / "summary.json").read_text())
    names = set(summary["candidates"])
    assert {"base~aa@c1", "ngram@c1", "base~aa@c2", "ngram@c2"} <= names
    rows = {(r["candidate"], r["level"]): r for r in summary["sweep"]}
    for level in (1, 2):
        r = rows[("ngram", level)]
        assert r["n"] == 4 and r["throughput_tok_s"] > 0 and r["latency_p95_s"] >= r["latency_p50_s"] > 0
        assert r["aa_floor_rate"] is not None and r["speedup"] > 0
        ident = summary["candidates"][f"ngram@c{level}"]["suites"]["mini"]["identity"]["T=0"]
        assert "floor" in ident and ident["floor"]["n"] == 4
    assert summary["candidates"]["base~aa@c1"]["verdict"] == "floor"
    assert (run_dir / "figures" / "sweep.png").stat().st_size > 1000
    assert "concurrency sweep" in (run_dir / "report.txt").read_text()
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    assert {r["candidate"] for r in records} == {"base@c1", "base~aa@c1", "ngram@c1", "base@c2", "base~aa@c2", "ngram@c2"}
    assert code in (0, 1)  # the verdict is the engine's; the sweep's shape is what is tested here
    from harness.run import tracking
    ids = tracking.log_run(run_dir, f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = tracking._client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert "figures/sweep.png" in [a.path for a in client.list_artifacts(ids["parent"], "figures")]


def test_aa_run_on_another_engine_and_sweep_specs():
    from pathlib import Path

    from harness.config import load_config
    from harness.run.engines import needed
    from harness.run.sweep import all_specs, level_config
    cfg = load_config(Path(__file__).parent / "data" / "engine-unstable.toml", "smoke")
    specs = {s.name: s for s in all_specs(cfg)}
    assert specs["llama~aa"].options["engine"] == "llama-unstable" and specs["llama~aa"].role == "aa-floor"
    assert "aa_engine" not in specs["llama"].options and specs["llama"].options["engine"] == "llama"
    assert "llama-unstable" in needed(cfg)
    swept = load_config(Path(__file__).parent.parent / "regress-engine.toml", "sweep")
    names = [s.name for s in all_specs(swept)]
    assert names[:4] == ["llama@c1", "llama~aa@c1", "llama-ngram@c1", "llama-draft@c1"] and "llama-draft@c4" in names
    assert level_config(swept, 4).candidates[1].options["concurrency"] == 4
