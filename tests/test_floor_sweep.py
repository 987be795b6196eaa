"""The A/A nondeterminism floor and concurrency sweeps: the floor statistics on constructed
identity blocks (a candidate within the floor passes, one beyond it fails, a zero floor is
strict identity), and a real llama.cpp sweep through `regress`."""
from __future__ import annotations

import json

import pytest

from harness.verdict import floor
from harness.verdict.gate import _identity_gates


def block(n: int, diverged: list[int], kind: str = "real", margin: float = 0.05) -> dict:
    divs = [{"item_id": f"p{i}", "seed": 0, "temperature": 0.0, "position": 3, "margin": margin, "kind": kind,
             "baseline_token": 1, "candidate_token": 2} for i in diverged]
    return {"rate": 1 - len(diverged) / n, "n": n, "identical": n - len(diverged), "divergences": divs,
            "near_ties": sum(kind == "near-tie" for _ in divs), "real_divergences": len(divs)}


def level(scale: float) -> dict:
    """An A/A run of one level whose margins moved by up to `scale` (harness.verdict.floor)."""
    return {"aa": "base~aa", "valid": True, "problems": [], "scale": scale, "eps": 1e-3, "positions": 400,
            "flips": 6}


def cand_with(ident: dict) -> dict:
    return {"kind": "exact", "suites": {"s": {"identity": {"T=0": ident}}}}


def test_candidate_within_a_nonzero_floor_passes():
    aa = block(200, [1, 2, 3, 4, 5, 6])           # the engine disagrees with itself on 6/200, at margin 0.05
    cand = block(200, [1, 2, 3, 7, 8, 9])         # 3 shared, 3 of its own: no more than the floor
    f = cand["floor"] = floor.compare(cand, aa, level(0.1), alpha=0.05)
    assert f["rate"] == pytest.approx(0.03) and not f["exceeds"] and f["plan"]["shared"] == pytest.approx(0.5)
    assert cand["within_noise"] == 6 and cand["real_divergences"] == 0
    [g] = _identity_gates(cand_with(cand), check_sampled=False)
    assert g.status == "pass" and "within the floor" in g.detail


def test_candidate_beyond_the_floor_fails():
    aa = block(40, [1, 2])
    broken = block(40, list(range(1, 21)))        # half the prompts move: a lossy decoder called exact
    f = broken["floor"] = floor.compare(broken, aa, level(0.1), alpha=0.05)
    assert f["exceeds"] and f["pvalue"] < 1e-4 and f["difference_lower_bound"] > 0.2
    [g] = _identity_gates(cand_with(broken), check_sampled=False)
    assert g.status == "fail" and "more than the floor" in g.detail


def test_zero_floor_is_strict_identity():
    aa = block(40, [])
    one = block(40, [5], margin=0.5)
    one["floor"] = floor.compare(one, aa, level(0.0), alpha=0.05)
    [g] = _identity_gates(cand_with(one), check_sampled=False)
    assert g.status == "fail" and "1 divergence(s) beyond the engine's own noise" in g.detail
    tie = block(40, [5], kind="near-tie", margin=1e-4)
    tie["floor"] = floor.compare(tie, aa, level(0.0), alpha=0.05)
    assert _identity_gates(cand_with(tie), check_sampled=False)[0].status == "pass"


@pytest.mark.slow
@pytest.mark.usefixtures("llama_server")
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
        assert r["aa_noise"] is not None and r["aa_floor_valid"] is not None
        ident = summary["candidates"][f"ngram@c{level}"]["suites"]["mini"]["identity"]["T=0"]
        assert "floor" in ident and ident["floor"]["n"] == 4
    assert summary["candidates"]["base~aa@c1"]["verdict"] == "floor"
    assert (run_dir / "figures" / "sweep.png").stat().st_size > 1000
    assert "concurrency sweep" in (run_dir / "report.txt").read_text()
    assert "A/A floor base~aa@c2: noise" in (run_dir / "report.txt").read_text()
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


def _aa_config(tmp_path, n: int, aa_args: list[str] | None):
    """Baseline llama.cpp (Q4_1, one slot), its A/A run on a server started with `aa_args` (None:
    on the candidate's server), and a candidate that serves the weights quantized again to Q2_K
    under the same name, declared exact: outputs that move for a reason no batch noise explains."""
    from harness.run.engines import gguf
    from test_engines import engine_config, launch_args, write_suite
    suite = write_suite(tmp_path, n=n)
    plain = launch_args("-np", "1", "--spec-type", "none")
    q2k = [a if a != gguf("smollm2-135m") else gguf("smollm2-135m-q2k") for a in plain]
    engines = {"plain": plain, "q2k": q2k, **({"other": launch_args(*aa_args)} if aa_args else {})}
    cfg = engine_config(tmp_path, suite, engines, [("q2k-as-exact", "q2k")])
    aa = "other" if aa_args else "q2k"
    text = cfg.read_text().replace('options = { engine = "plain" }',
                                   f'options = {{ engine = "plain", aa_engine = "{aa}" }}', 1)
    cfg.write_text(text.replace('seeds = [0]\n', 'seeds = [0]\nmax_new_tokens = 16\n'))
    return cfg


@pytest.mark.slow
def test_regress_with_an_aa_server_refusing_every_request_does_not_pass_a_lossy_candidate(tmp_path):
    """Issue 21 through `regress`: the A/A run goes to a server that refuses every request (it
    wants an API key). Before, its error rows counted as divergences at token 0, the floor was 1.0
    and the Q2_K server declared exact passed "within the floor" (exit 0). Now the A/A run is no
    floor: the candidate is inconclusive, which fails under inconclusive = "fail", naming the A/A run."""
    cfg = _aa_config(tmp_path, 3, ["-np", "1", "--spec-type", "none", "--api-key", "k"])
    run_dir = tmp_path / "run"
    code = main_regress(cfg, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    aa = summary["candidates"]["base~aa"]
    assert not aa["floor"]["valid"] and "3 of 3 A/A pairs are errors" in aa["floor"]["problems"][0]
    cand = summary["candidates"]["q2k-as-exact"]
    [g] = [g for g in cand["gates"] if g["name"].startswith("identity")]
    assert g["status"] == "fail" and g["detail"].startswith("inconclusive: the A/A run base~aa is not a valid floor")
    assert "HTTP 401" in g["detail"]
    assert code == 1 and cand["verdict"] == "fail"
    assert "NOT A VALID FLOOR" in (run_dir / "report.txt").read_text()


def main_regress(cfg, run_dir) -> int:
    from harness.cli import main
    return main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"])


@pytest.mark.slow
def test_regress_with_an_aa_run_on_another_quantization_does_not_pass_it(tmp_path):
    """Issue 21 through `regress`: the A/A run lands on a server with another quantization behind
    the same alias (here the Q2_K server the candidate also uses). Before, its divergences were
    the floor, the candidate's matched them one for one, and a lossy candidate declared exact
    passed "within the floor" (exit 0). Now such an A/A run is no floor: it diverges on more
    prompts than aa_floor_max and its margins move more than aa_noise_max logits."""
    cfg = _aa_config(tmp_path, 3, None)
    run_dir = tmp_path / "run"
    code = main_regress(cfg, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    level = summary["candidates"]["base~aa"]["floor"]
    assert not level["valid"] and level["diverged"] >= 1, level
    assert any("aa_floor_max" in p or "aa_noise_max" in p for p in level["problems"]), level
    cand = summary["candidates"]["q2k-as-exact"]
    [g] = [g for g in cand["gates"] if g["name"].startswith("identity")]
    assert g["status"] == "fail" and g["detail"].startswith("inconclusive: the A/A run base~aa"), g
    assert code == 1


def test_an_aa_engine_serving_another_model_is_refused(tmp_path):
    """`aa_engine` sends the A/A run to another server, to see what changes the engine's numerics;
    one declared to serve another model measures that model's disagreement, not this engine's
    noise, and a wide enough one excuses a candidate's divergences. It loaded without a word."""
    from pathlib import Path

    from harness.config import ConfigError, load_config
    text = (Path(__file__).parent / "data" / "engine-unstable.toml").read_text()
    unstable = '[engines.llama-unstable]     # the same model with other threads and micro-batches: other numerics\n'
    assert unstable in text
    cfg = tmp_path / "other-model.toml"
    cfg.write_text(text.replace(unstable, unstable.replace("\n", "\nmodel = \"smollm2-360m\"\n", 1), 1)
                   .replace('-np", "4", "-b", "8", "-ub", "8", "--metrics", "--spec-type", "none"]\nmodel = "smollm2-135m"\n',
                            '-np", "4", "-b", "8", "-ub", "8", "--metrics", "--spec-type", "none"]\n', 1))
    with pytest.raises(ConfigError, match=r"aa_engine.*'llama-unstable'.*'smollm2-360m'.*'llama'.*'smollm2-135m'"):
        load_config(cfg, "smoke")
    assert load_config(Path(__file__).parent / "data" / "engine-unstable.toml", "smoke")  # the same model: fine


def _level_summary(aa: dict, cands: dict, noise: float) -> dict:
    flips = [{"item_id": d["item_id"], "seed": 0, "position": 3, "margin": d["margin"], "aa_margin": d["margin"],
              "shift": 2 * d["margin"]} for d in aa["divergences"]]
    aa_suite = {"aa_noise": {"pairs": aa["n"], "errors": [], "flips": flips, "positions": 8 * aa["n"],
                             "missing_margins": 0, "missing_at": [], "max_shift": noise, "p99_shift": noise},
                "identity": {"T=0": aa}}
    out = {"near_tie_epsilon": {"value": 1e-3}, "candidates": {"base~aa": {"suites": {"a": aa_suite, "b": aa_suite}}}}
    for name, ident in cands.items():
        out["candidates"][name] = {"kind": "exact", "suites": {s: {"identity": {"T=0": dict(ident, divergences=[
            dict(d) for d in ident["divergences"]])}} for s in ("a", "b")}}
    return out


def test_a_candidates_blocks_are_pooled_across_levels_into_one_test():
    """Two suites at concurrency 2 and 4 (each with a floor) are four blocks of the same candidate,
    tested together: all pooled at alpha / 2, each level's at alpha / 4. 5 candidate-only against 2
    A/A-only in each block is p = 0.227 alone, 10 against 4 per level p = 0.090, but 20 against 8
    over all 160 prompts p = 0.018 < 0.025: an excess, and every block leans that way, so each
    fails (split at alpha / 4 per block it passed everywhere). A concurrency-1 level whose A/A noise
    is 0 cannot excuse anything and is no part of the test; another candidate is its own family."""
    from harness.config import Gates
    gates = Gates()
    aa, cand = block(40, [1, 2]), block(40, [5, 6, 7, 8, 9])
    parts = [(_level_summary(aa if c > 1 else block(40, []), {f"ngram@c{c}": cand, f"draft@c{c}": cand},
                             0.1 if c > 1 else 0.0),
              "base~aa", [f"ngram@c{c}", f"draft@c{c}"]) for c in (1, 2, 4)]
    for summary, _, names in parts[1:]:  # sampled blocks too: never pooled (a sampled flip bounds no margin)
        summary["candidates"]["base~aa"]["suites"]["a"]["identity"]["T=0.7"] = block(40, list(range(10)))
        for name in names:
            summary["candidates"][name]["suites"]["a"]["identity"]["T=0.7"] = block(40, [])
    for i, c in enumerate((1, 2, 4)):  # each level's A/A run under its own name, as the sweep names them
        summary = parts[i][0]
        summary["candidates"][f"base~aa@c{c}"] = summary["candidates"].pop("base~aa")
        parts[i] = (summary, f"base~aa@c{c}", parts[i][2])
    floor.apply_levels(parts, gates)
    f = parts[1][0]["candidates"]["ngram@c2"]["suites"]["a"]["identity"]["T=0"]["floor"]
    assert (f["blocks"], f["pooled_n"], f["block_counts"], f["level"]) == (4, 160, (5, 2, 40), "c2"), f
    every, level = f["routes"]
    assert (every["route"], every["candidate_only"], every["floor_only"], every["n"]) == ("all levels", 20, 8, 160)
    assert every["alpha"] == gates.alpha / 2 and every["pvalue"] == pytest.approx(0.0178, abs=1e-4) and every["exceeds"]
    assert (level["route"], level["candidate_only"], level["floor_only"], level["alpha"]) == ("level c2", 10, 4, 0.0125)
    assert not level["exceeds"] and f["exceeds"] and f["candidate_only"] == 5
    assert not floor.rate_test(5, 2, 40, gates.alpha)["exceeds"]  # each block alone passes
    draft = parts[2][0]["candidates"]["draft@c4"]["suites"]["b"]["identity"]["T=0"]
    assert draft["floor"]["pooled_n"] == 160  # not 320: ngram's blocks are not draft's
    status = floor.gate_detail(draft)
    assert status[0] == "fail" and "all levels: 20 candidate-only against 8 A/A-only over 160 prompts" in status[1]
    assert "in this block 5 candidate-only, 2 A/A-only prompts" in status[1], status
    # the plan beside it is over all the candidate's prompts: 28 divergences over 2 x 160, none shared
    assert (f["plan"]["n"], f["plan"]["noise_rate"], f["plan"]["shared"]) == (160, 0.0875, 0.0), f["plan"]
    assert "over 160 prompts at 2 level(s): a correct engine passes with probability at least" in status[1], status
    c1 = parts[0][0]["candidates"]["ngram@c1"]["suites"]["a"]["identity"]["T=0"]
    assert "routes" not in c1["floor"] and floor.gate_detail(c1)[0] == "fail"  # noise 0: strict identity


def test_an_excess_in_one_block_fails_it_and_a_block_that_leans_the_other_way_passes_saying_why():
    """The review: with every block's counts pooled, a block that diverged less than the A/A run
    read "more than the floor" with the pooled counts beside its own prompts. A block fails only
    where its own prompts lean the same way as the test that found the excess."""
    from harness.config import Gates
    summary = _level_summary(block(40, [1, 2]), {}, 0.1)
    summary["candidates"]["base~aa"]["suites"]["b"] = {**summary["candidates"]["base~aa"]["suites"]["a"],
                                                       "identity": {"T=0": block(40, [1, 2, 3])}}
    summary["candidates"]["x"] = {"kind": "exact", "suites": {
        "a": {"identity": {"T=0": block(40, list(range(10, 22)))}},   # 12 candidate-only, 2 A/A-only
        "b": {"identity": {"T=0": block(40, [30])}}}}                   # 1 candidate-only, 3 A/A-only
    floor.apply_levels([(summary, "base~aa", ["x"])], Gates())
    a, b = (floor.gate_detail(summary["candidates"]["x"]["suites"][k]["identity"]["T=0"]) for k in "ab")
    assert a[0] == "fail" and "in this block 12 candidate-only, 2 A/A-only prompts" in a[1], a
    assert b[0] == "pass" and "whose own prompts show no excess" in b[1], b
    assert "in this block 1 candidate-only, 3 A/A-only prompts" in b[1], b


def test_an_invalid_floors_block_is_no_part_of_the_pool():
    """A block whose A/A run is not a valid floor excuses nothing (its divergences are judged
    inconclusive there); its A/A-only prompts must not dilute the pooled test of the others."""
    from harness.config import Gates
    gates = Gates()
    good = _level_summary(block(40, [1]), {"x@c2": block(40, [5, 6, 7, 8, 9])}, 0.1)
    bad = _level_summary(block(40, list(range(20))), {"x@c4": block(40, [])}, 0.1)  # diverged on half: > aa_floor_max
    # and a suite on which the A/A run has fewer pairs than the candidate: that block alone is no floor
    good["candidates"]["base~aa"]["suites"]["c"] = {**good["candidates"]["base~aa"]["suites"]["a"],
                                                    "identity": {"T=0": block(30, list(range(10)))}}
    good["candidates"]["x@c2"]["suites"]["c"] = {"identity": {"T=0": block(40, [])}}
    floor.apply_levels([(good, "base~aa", ["x@c2"]), (bad, "base~aa", ["x@c4"])], gates)
    f = good["candidates"]["x@c2"]["suites"]["a"]["identity"]["T=0"]["floor"]
    assert not bad["candidates"]["base~aa"]["floor"]["valid"]
    assert not good["candidates"]["x@c2"]["suites"]["c"]["identity"]["T=0"]["floor"]["valid"]
    [test] = f["routes"]  # one level: one test at alpha
    assert (f["blocks"], test["candidate_only"], test["floor_only"], test["alpha"]) == (2, 10, 2, 0.05), f
    assert test["exceeds"] and f["exceeds"]  # p = 0.019


# ---- from the issue-58 review's mutation pass (mutmut on harness/verdict/floor.py): each test
# ---- below fails on a mutant that survived the suite (named in the test's docstring)


def test_a_sampled_divergence_within_the_noise_is_never_excused():
    """A divergence at T > 0 has a raw margin that bounds no perturbed gap: it stays "real" and
    fails, even where its margin is below the A/A noise (mutants dropping the temperature check)."""
    s = block(40, [3], margin=0.05)
    s["divergences"][0]["temperature"] = 0.7
    s["floor"] = floor.compare(s, block(40, [1, 2]), level(0.1), alpha=0.05)
    assert s["divergences"][0]["kind"] == "real" and s["within_noise"] == 0
    assert floor.gate_detail(s)[0] == "fail"


def test_a_divergence_at_exactly_the_noise_scale_is_within_it():
    """'up to the A/A noise scale' (mutant: m < scale)."""
    cand = block(40, [3], margin=0.1)
    cand["floor"] = floor.compare(cand, block(40, [1, 2]), level(0.1), alpha=0.05)
    assert cand["divergences"][0]["kind"] == "within-floor"


def test_the_aa_runs_near_ties_do_not_excuse_the_candidates_divergences():
    """Only A/A divergences at or above the near-tie epsilon are the floor's (mutants: `or` for
    `and`, `>` for `>=`): 5 candidate-only prompts against none is p = 1/32 < 0.05, an excess,
    whether the A/A run has near-ties elsewhere; an A/A divergence at exactly eps counts."""
    aa = block(40, [1, 2, 3], kind="near-tie", margin=1e-4)
    cand = block(40, [5, 6, 7, 8, 9])
    f = cand["floor"] = floor.compare(cand, aa, level(0.1), alpha=0.05)
    assert (f["candidate_only"], f["floor_only"]) == (5, 0) and f["exceeds"]
    at_eps = block(40, [1], margin=1e-3)
    cand = block(40, [5, 6, 7, 8, 9])
    f = cand["floor"] = floor.compare(cand, at_eps, level(0.1), alpha=0.05)
    assert (f["candidate_only"], f["floor_only"]) == (5, 1)


def test_real_divergences_count_the_ones_without_a_margin():
    """real_divergences = beyond the noise + no margin (mutant: minus)."""
    cand = block(40, [3], margin=0.5)
    cand["divergences"] += block(40, [4], kind="unknown", margin=None)["divergences"]
    cand["identical"] = 38
    cand["floor"] = floor.compare(cand, block(40, [1]), level(0.1), alpha=0.05)
    assert cand["real_divergences"] == 2 and floor.gate_detail(cand)[0] == "fail"


def test_passes_agrees_with_the_exact_test_at_its_boundary():
    """The vectorised rule the plan sums is the gate's test, at alpha = 1/32 too, where 5 of 5
    candidate-only prompts have p exactly alpha (not an excess; mutant: <=)."""
    for alpha in (0.05, 1 / 32, 0.0125):
        for b in range(12):
            for c in range(6):
                assert bool(floor.passes(b, c, alpha)) == (not floor.rate_test(b, c, 40, alpha)["exceeds"]), (b, c)


def test_a_level_without_its_aa_run_does_not_stop_the_others_being_judged():
    """apply_levels skips a level whose A/A run is missing and judges the rest (mutant: break)."""
    from harness.config import Gates
    cand = block(40, [5])
    first = _level_summary(block(40, [1, 2]), {"x@c1": cand}, 0.1)
    del first["candidates"]["base~aa"]
    parts = [(first, "base~aa", ["x@c1"]), (_level_summary(block(40, [1, 2]), {"x@c2": cand}, 0.1), "base~aa", ["x@c2"])]
    floor.apply_levels(parts, Gates())
    assert "floor" in parts[1][0]["candidates"]["x@c2"]["suites"]["a"]["identity"]["T=0"]
    assert "floor" not in parts[0][0]["candidates"]["x@c1"]["suites"]["a"]["identity"]["T=0"]


@pytest.mark.parametrize("profile,pooled,levels", [("sweep", 36, "2, 4"), ("floor", 1254, "2, 3, 4")])
def test_the_shipped_profiles_plan_counts_the_levels_with_a_floor(profile, pooled, levels):
    """regress-engine.toml's plan before the run: the sweep's concurrency 1 is strict identity, no
    part of the pool (36 greedy prompts at 2 and 4 in flight); the floor profile pools 1,254 and
    says they are enough at the assumed noise 0.05 (the sweep names what would be)."""
    from pathlib import Path

    from harness.config import load_config
    from harness.run import runner
    config = load_config(Path(__file__).parent.parent / "regress-engine.toml", profile)
    text = floor.plan_table(config, runner.load_suites(config))
    assert f"{pooled:,} greedy prompts" in text and f"at concurrency {levels})" in text, text
    assert text.endswith("enough") == (profile == "floor"), text


def test_fail_fast_leaves_an_engine_under_concurrency_to_the_floor():
    """The review: --fail-fast stopped an exact engine candidate at its first divergence above the
    near-tie epsilon, so a correct engine's flip within its own A/A noise at concurrency 2 failed
    it before any floor was measured. Under concurrency only the floor can judge; at concurrency 1
    (and for in-process decoders) fail-fast stops it as before."""
    from harness.config import DecoderSpec
    from harness.run import runner
    from harness.run.sweep import _at
    spec = DecoderSpec(name="ngram", decoder="llama.cpp", kind="exact", options={"engine": "e"})
    assert runner.under_floor(_at(spec, 2)) and runner.under_floor(_at(spec, 4))
    assert not runner.under_floor(_at(spec, 1)) and not runner.under_floor(spec)
    from types import SimpleNamespace

    from harness.config import Gates
    stops = []
    base = {"suite": "factual", "item_id": "7", "seed": 0, "temperature": 0.0, "tokens": [1, 2, 3], "margins": [1, 1, 0.02]}
    ledger = SimpleNamespace(stops=SimpleNamespace(stopped=lambda *a: False, add=lambda **k: stops.append(k)),
                             base_rows={("factual", "7", 0, 0.0): base})
    config = SimpleNamespace(gates=Gates(near_tie_epsilon=1e-3), engines={"e": SimpleNamespace(concurrency=1)})
    for level, stopped in ((2, 0), (1, 1)):
        row = dict(base, candidate=f"ngram@c{level}", tokens=[1, 2, 4])
        runner.check_divergence(config, None, _at(spec, level), row, ledger)
        assert len(stops) == stopped, (level, stops)
    # no sweep, but the engine table keeps 8 requests in flight: the floor judges it too
    config.engines["e"] = SimpleNamespace(concurrency=8)
    runner.check_divergence(config, None, spec, dict(base, candidate="ngram", tokens=[1, 2, 4]), ledger)
    assert len(stops) == 1, stops
