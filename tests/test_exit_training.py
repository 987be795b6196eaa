"""Exit heads trained for the target (`train-exits`), thresholds with a guarantee
(`calibrate-exits`, Learn-then-Test), the self-draft through heads, and the frontier, on tiny
models. Every check here could fail: a head that does not train, a broken LTT, a self-draft
that the heads would make inexact, a half-written heads folder that loads."""
from __future__ import annotations

import json

import numpy as np
import pytest

from decoders import GenerationRequest
from decoders.base import DecoderError
from decoders.exit_heads import identity_heads, load_exit_heads, model_fingerprint, save_exit_heads
from harness.cli import build_parser, main
from harness.exits import ltt
from harness.exits import prompts as P

TRAIN = ["--target", "tiny-llama", "--prompts", "24", "--valid-prompts", "8", "--steps", "40",
         "--max-new-tokens", "24", "--lr", "1e-3", "--no-progress"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Continuations and default heads go to a scratch cache, not the user's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DECODEGATE_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def heads_dir(cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("heads") / "tiny-llama"
    assert main(["train-exits", *TRAIN, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def calibrated(heads_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cal")
    assert main(["calibrate-exits", "--target", "tiny-llama", "--exit-heads", str(heads_dir), "--epsilon", "0.2",
                 "--delta", "0.1", "--calib-prompts", "60", "--test-prompts", "40", "--max-new-tokens", "16",
                 "--seeds", "5", "--decoder-check-prompts", "6", "--grid", "0.5,0.3,0.2,0.15,0.1,0.05",
                 "--out", str(out), "--no-progress"]) == 0
    return out


# ------------------------------------------------------------------------------- training data

def test_training_prompts_are_disjoint_from_every_suite_and_split_by_hash():
    kept, report = P.check_disjoint()
    assert {"factual", "code", "refusal", "longform"} <= set(report["suites"])
    splits = {s: set(P.prompts(s)) for s in P.SPLITS}
    assert sum(map(len, splits.values())) == len(kept)
    assert not any(splits[a] & splits[b] for a in splits for b in splits if a < b)
    from suites import load_suite
    for name in ("factual", "code", "refusal", "longform"):
        texts = {(it.prompt or it.messages[-1]["content"]).strip().lower() for it in load_suite(name).items}
        assert not texts & {p.lower() for p in kept}
    # The filter really drops a near-copy of a suite item.
    assert any("freezing point" in p or "duplicate values" in p for p in report["dropped_for_overlap"])


# ---------------------------------------------------------------------------------- training

def test_trained_heads_beat_the_logit_lens_on_held_out_text(heads_dir):
    meta = json.loads((heads_dir / "exit_heads.json").read_text())
    for layer, v in meta["held_out"]["layers"].items():
        assert v["kl_head"] < 0.9 * v["kl_lens"], layer
        assert v["agree_head"] >= v["agree_lens"], layer
    assert meta["held_out"]["tokens"] > 100
    # KL steps improve on the least-squares start, at least on the layers that have room.
    assert sum(v["kl_head"] for v in meta["held_out"]["layers"].values()) < \
        sum(v["kl_init"] for v in meta["held_out"]["layers"].values())
    from harness.models import load_model
    assert meta["target_fingerprint"] == model_fingerprint(load_model("tiny-llama").model)
    assert meta["training"]["steps"] == 40 and meta["training"]["seed"] == 0
    assert len(meta["data"]["hash"]) == 16 and meta["data"]["positions"] > 0
    assert meta["layers"] == [1, 2, 3] and meta["num_layers"] == 4


def test_kl_training_alone_lowers_the_loss_from_the_logit_lens(cache, tmp_path):
    out = tmp_path / "zero"
    assert main(["train-exits", *TRAIN, "--init", "zero", "--layers", "2", "--out", str(out)]) == 0
    v = json.loads((out / "exit_heads.json").read_text())["held_out"]["layers"]["2"]
    assert v["kl_init"] == pytest.approx(v["kl_lens"], rel=1e-5)   # zero heads are the logit lens
    assert v["kl_head"] < 0.95 * v["kl_lens"]


@pytest.mark.full
def test_a_time_budget_shortens_the_schedule(cache, tmp_path):
    from harness.exits.train import Settings, planned_steps
    s = Settings((1,), 1, 1, (0.0,), 1, 300, 100, 1e-3, "zero", 0)
    assert planned_steps(s, 3, 1.0, 10.0, 0) == 300            # too early to estimate
    assert planned_steps(s, 10, 2.0, 10.0, 0) == 50            # 0.2 s a step, 8 s left: 40 more
    assert planned_steps(s, 10, 2.0, 10.0, 1000) == 40         # 2 s kept for the evaluation
    assert planned_steps(s, 10, 12.0, 10.0, 0) == 10           # over budget: stop
    out = tmp_path / "budget"
    assert main(["train-exits", *TRAIN, "--steps", "100000", "--time-budget", "4", "--out", str(out)]) == 0
    meta = json.loads((out / "exit_heads.json").read_text())
    assert 5 <= meta["training"]["steps"] < 100000 and meta["seconds"]["total"] < 8


def test_heads_for_another_target_are_refused_naming_both(heads_dir, tiny_qwen2):
    from decoders.early_exit import EarlyExitDecoder
    from decoders.speculative import SpeculativeDecoder
    for make in (lambda: EarlyExitDecoder(tiny_qwen2, exit_heads=str(heads_dir)),
                 lambda: SpeculativeDecoder(tiny_qwen2, draft="self:2", exit_heads=str(heads_dir))):
        with pytest.raises(DecoderError, match="tiny-llama.*tiny-qwen2"):
            make()


def test_shape_mismatch_is_refused(tmp_path, tiny_llama):
    from decoders.early_exit import EarlyExitDecoder
    save_exit_heads(tmp_path / "h", identity_heads(64, [2]), target="other", num_layers=6)
    with pytest.raises(DecoderError, match="6 layers.*has 4"):
        EarlyExitDecoder(tiny_llama, exit_heads=str(tmp_path / "h"))


def test_interrupted_training_leaves_nothing_loadable_and_resumes(cache, tmp_path, monkeypatch, capsys):
    from harness.exits import train as T
    out = tmp_path / "heads"
    calls = {"n": 0}
    real = T.kl_rows

    def interrupt(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3 * 25:   # three layers a step: stop inside step 25
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(T, "kl_rows", interrupt)
    assert main(["train-exits", *TRAIN, "--out", str(out)]) == 130
    assert not out.exists()
    partial = tmp_path / ".heads.partial"
    assert (partial / T.PARTIAL).is_file()
    with pytest.raises(DecoderError):
        load_exit_heads(partial)
    monkeypatch.setattr(T, "kl_rows", real)
    capsys.readouterr()
    assert main(["train-exits", *TRAIN, "--out", str(out)]) == 0
    assert "resuming from step 24" in capsys.readouterr().err
    meta = json.loads((out / "exit_heads.json").read_text())
    assert meta["training"]["steps"] == 40 and meta["training"]["resumed_from_step"] == 24
    assert not partial.exists()
    # --restart ignores a checkpoint
    monkeypatch.setattr(T, "kl_rows", interrupt)
    calls["n"] = 0
    assert main(["train-exits", *TRAIN, "--out", str(out)]) == 130
    monkeypatch.setattr(T, "kl_rows", real)
    assert main(["train-exits", *TRAIN, "--out", str(out), "--restart"]) == 0
    assert json.loads((out / "exit_heads.json").read_text())["training"]["resumed_from_step"] is None


def test_a_save_that_fails_midway_keeps_the_old_folder(tmp_path, monkeypatch):
    import safetensors.torch as st
    folder = tmp_path / "h"
    save_exit_heads(folder, identity_heads(8, [1, 2]), target="a")
    real, n = st.save_file, {"k": 0}

    def failing(*a, **k):
        n["k"] += 1
        if n["k"] == 2:
            raise OSError("disk full")
        return real(*a, **k)

    monkeypatch.setattr(st, "save_file", failing)
    with pytest.raises(OSError):
        save_exit_heads(folder, identity_heads(8, [1, 2, 3]), target="b")
    assert load_exit_heads(folder).meta["target"] == "a"          # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["h"]           # no temporary left behind
    n["k"] = 1                                                     # the next file written fails
    with pytest.raises(OSError):
        save_exit_heads(tmp_path / "new", identity_heads(8, [1]), target="c")
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------- self-draft + heads

@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 3}])
def test_self_draft_through_heads_stays_identical_to_standard(heads_dir, tiny_llama, sampling):
    from decoders.speculative import SpeculativeDecoder
    from decoders.standard import StandardDecoder
    std = StandardDecoder(tiny_llama)
    spec = SpeculativeDecoder(tiny_llama, draft="self:2", k=3, verify="coupled", exit_heads=str(heads_dir))
    for p in P.prompts("test")[:3]:
        req = GenerationRequest(tuple(tiny_llama.encode(p)), max_new_tokens=24, **sampling)
        a, b = std.generate(req), spec.generate(req)
        assert a.tokens == b.tokens
        assert b.stats["drafter"] == "self:2+head"


def test_heads_raise_self_draft_acceptance(heads_dir, tiny_llama):
    from decoders.speculative import SpeculativeDecoder
    rates = {}
    for heads in (None, str(heads_dir)):
        dec = SpeculativeDecoder(tiny_llama, draft="self:2", k=3, exit_heads=heads)
        acc = prop = 0
        for p in P.prompts("test")[:8]:
            r = dec.generate(GenerationRequest(tuple(tiny_llama.encode(p)), max_new_tokens=24))
            acc, prop = acc + r.stats["accepted"], prop + r.stats["proposed"]
        rates[heads] = acc / prop
    assert rates[str(heads_dir)] > rates[None]


def test_exit_heads_need_a_self_draft_with_a_head(heads_dir, tiny_llama):
    from decoders.speculative import SpeculativeDecoder
    with pytest.raises(DecoderError, match="self-draft"):
        SpeculativeDecoder(tiny_llama, draft="prompt-lookup", exit_heads=str(heads_dir))
    save_exit_heads(heads_dir.parent / "only1", identity_heads(64, [1]))
    with pytest.raises(DecoderError, match="no head for layer 2"):
        SpeculativeDecoder(tiny_llama, draft="self:2", exit_heads=str(heads_dir.parent / "only1"))


@pytest.mark.full
def test_bench_runs_self_draft_with_and_without_heads(heads_dir, calibrated, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--target", "tiny-llama", "--draft", "self:2", "--exit-heads", str(heads_dir),
                 "--thresholds", f"0.2,calibrated:{calibrated}", "--max-new-tokens", "12", "--rounds", "1",
                 "--temperatures", "0", "--no-hf", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["decoders"]
    assert {"spec[self:2]", "spec[self:2+head]", "early-exit[0.2]", "early-exit[0.2+heads]",
            f"early-exit[calibrated:{calibrated.name}]"} <= set(res)
    assert res["spec[self:2+head]"]["T=0"]["identity"] == 1.0
    assert 0 <= res["spec[self:2+head]"]["T=0"]["alpha"] <= 1


# ------------------------------------------------------------------------------ Learn-then-Test

def _draws(rng, n, risks):
    """Nested losses: sample i loses at grid point j iff u_i < risk_j (risk rises along the grid)."""
    u = rng.random(n)[:, None]
    return (u < np.asarray(risks)[None, :]).astype(float)


def _violation_rate(select, *, trials=400, n=150, eps=0.1, seed=0):
    """How often the chosen grid point's true risk exceeds eps, over fresh calibration draws."""
    risks = np.linspace(0.0, 0.3, 61)    # a fine grid crossing eps: where an uncorrected choice fails
    rng = np.random.default_rng(seed)
    bad = 0
    for _ in range(trials):
        j = select(_draws(rng, n, risks), risks)
        bad += j is not None and risks[j] > eps
    return bad / trials


def test_ltt_controls_the_risk_and_an_uncorrected_choice_is_caught():
    eps, delta = 0.1, 0.1
    grid = list(range(61))
    rate_ltt = _violation_rate(lambda x, r: ltt.learn_then_test(x, grid, epsilon=eps, delta=delta).index)
    rate_naive = _violation_rate(lambda x, r: ltt.naive_threshold(x, grid, epsilon=eps))
    assert rate_ltt <= delta                    # the guarantee (it is conservative here)
    assert rate_naive > 3 * delta               # what the check exists to catch


def test_ltt_pick_holds_on_held_out_draws():
    rng = np.random.default_rng(1)
    risks = np.linspace(0.0, 0.3, 31)
    res = ltt.learn_then_test(_draws(rng, 400, risks), list(risks), epsilon=0.1, delta=0.1)
    assert res.index is not None and res.certified == res.index + 1
    assert _draws(rng, 4000, risks)[:, res.index].mean() <= 0.1
    assert all(p <= 0.1 for p in res.pvalues[:res.certified]) and res.pvalues[res.certified] > 0.1


def test_p_values_are_valid_at_the_boundary():
    """Under risk exactly eps, P(p <= delta) <= delta for the binomial and HB p-values."""
    rng = np.random.default_rng(2)
    n, eps, delta = 100, 0.2, 0.1
    binary = rng.random((4000, n)) < eps
    p_bin = [ltt.binomial_pvalue(int(row.sum()), n, eps) for row in binary]
    bounded = rng.beta(2, 8, (4000, n))          # mean 0.2 in [0, 1]
    p_hb = [ltt.hb_pvalue(row.mean(), n, eps) for row in bounded]
    assert np.mean(np.asarray(p_bin) <= delta) <= delta
    assert np.mean(np.asarray(p_hb) <= delta) <= delta
    assert ltt.hb_pvalue(0.05, n, eps) < 0.01 and ltt.binomial_pvalue(5, n, eps) < 0.01


def test_n_needed_and_bad_levels():
    assert ltt.n_needed(0.1, 0.1) == 22            # 0.9^22 = 0.098 <= 0.1 < 0.9^21
    assert 0.9 ** 22 <= 0.1 < 0.9 ** 21
    with pytest.raises(ltt.CalibrationError, match="needs at least n=22"):
        ltt.learn_then_test(np.zeros((21, 3)), [0.9, 0.8, 0.7], epsilon=0.1, delta=0.1)
    for bad in (0, 1, -0.1, 1.5, float("nan")):
        with pytest.raises(ltt.CalibrationError, match="epsilon"):
            ltt.n_needed(bad, 0.1)


@pytest.mark.parametrize("args, match", [
    (["--epsilon", "1.5"], "epsilon must be in"), (["--delta", "0"], "delta must be in"),
    (["--calib-prompts", "10"], "needs n >= 22"), (["--grid", "0.9,1.2"], "grid"),
])
def test_calibrate_bad_input_exits_2(args, match, tmp_path, capsys):
    assert main(["calibrate-exits", "--target", "tiny-llama", "--out", str(tmp_path), *args]) == 2
    assert match in capsys.readouterr().err


# ------------------------------------------------------------------------------- calibrate-exits

def test_calibration_certifies_and_holds_out(calibrated, heads_dir, tiny_llama):
    cal = json.loads((calibrated / "exit_calibration.json").read_text())
    assert cal["epsilon"] == 0.2 and cal["delta"] == 0.1 and cal["n"] == 60 and cal["loss"] == "token"
    assert cal["exit_heads"] == str(heads_dir.resolve()) and cal["heads_hash"]
    assert cal["certified"] and cal["held_out"]["risk"] <= cal["epsilon"]
    assert cal["resplits"]["seeds"] == 5 and cal["resplits"]["exceeded"] <= 1
    assert cal["decoder_check"]["tokens"] > 0
    th = next(iter(cal["thresholds"].values()))
    # Fixed sequence: every grid point before the chosen one was certified too.
    k = cal["grid"].index(th)
    assert all(p <= cal["delta"] for p in cal["pvalues"][:k + 1])
    # The risk estimate is the decoder's: the teacher-forced frontier row of the chosen threshold
    # is consistent with the real decoder's held-out disagreement (no state propagation in one).
    assert cal["decoder_check"]["token_disagreement"] <= 0.5
    from decoders.early_exit import EarlyExitDecoder
    dec = EarlyExitDecoder(tiny_llama, threshold=f"calibrated:{calibrated}")
    assert dec.heads is not None and set(dec.plan.thresholds) == {th}
    r = dec.generate(GenerationRequest(tuple(tiny_llama.encode("hello")), max_new_tokens=6))
    assert r.stats["calibration"] == f"calibrated:{calibrated}"


def test_onepass_and_decoder_estimates_agree_where_no_state_was_propagated(heads_dir, tiny_llama):
    """The first new token is decided on the full-depth prompt pass, so both estimators must see
    the same exit decision there; later tokens may differ (propagated state) but not at 1.0."""
    from decoders.exit_heads import load_exit_heads
    from harness.exits import data
    from harness.exits.calibrate import _Forced, _onepass
    from harness.exits.train import Lens
    heads = load_exit_heads(heads_dir)
    conts = data.continuations(tiny_llama, P.prompts("calib")[:12], temperatures=(0.0,), max_new_tokens=12,
                               progress=False)
    grid = [1.0, 0.3, 0.15, 0.05]
    one = _onepass(tiny_llama, Lens(tiny_llama.model), heads, heads.layers, grid, 4, conts, False, "x")
    forced = _Forced(tiny_llama, heads, heads.layers, conts)
    assert all(c.tokens for c in conts)
    first = [int(np.flatnonzero(one["owner"] == i)[0]) for i in range(len(conts))]  # each sequence's first
    fired = False
    for k, lam in enumerate(grid):
        col = forced.column(lam, progress=False, desc="")
        first_f = [int(np.flatnonzero(col["owner"] == i)[0]) for i in range(len(conts))]
        assert np.array_equal(col["loss"][first_f], one["loss"][first, k])
        assert np.array_equal(col["depth"][first_f], one["depth"][first, k])
        fired |= bool((col["depth"] < 4).any())
        if lam == 1.0:
            assert col["loss"].sum() == 0 and (col["depth"] == 4).all()
    assert fired


@pytest.mark.full  # a decoder run per threshold (9 s); the one-pass estimate and LTT's guarantee stay in make check
def test_decoder_estimate_stops_after_the_first_uncertified_point(heads_dir, tmp_path):
    out = tmp_path / "cal"
    grid = "0.5,0.3,0.2,0.15,0.1,0.05,0.02,0.0"
    assert main(["calibrate-exits", "--target", "tiny-llama", "--exit-heads", str(heads_dir), "--epsilon", "0.2",
                 "--delta", "0.1", "--calib-prompts", "40", "--test-prompts", "20", "--max-new-tokens", "12",
                 "--estimate", "decoder", "--grid", grid, "--seeds", "3", "--out", str(out), "--no-progress"]) == 0
    cal = json.loads((out / "exit_calibration.json").read_text())
    assert cal["estimate"] == "decoder" and cal["decoder_check"] is None
    run = len(cal["grid"])
    assert cal["grid"] == [float(x) for x in grid.split(",")][:run]
    assert cal["grid_certified"] == run - 1 < 8           # stopped at the first point it could not certify
    assert cal["pvalues"][-1] > cal["delta"] and cal["held_out"]["risk"] <= cal["epsilon"]


def test_calibrated_thresholds_refuse_other_heads_and_targets(calibrated, tmp_path, tiny_llama, tiny_qwen2):
    from decoders.early_exit import EarlyExitDecoder
    save_exit_heads(tmp_path / "other", identity_heads(64, [1, 2, 3]))
    with pytest.raises(DecoderError, match="other exit heads"):
        EarlyExitDecoder(tiny_llama, threshold=f"calibrated:{calibrated}", exit_heads=str(tmp_path / "other"))
    with pytest.raises(DecoderError, match="calibrated for target 'tiny-llama'"):
        EarlyExitDecoder(tiny_qwen2, threshold=f"calibrated:{calibrated}")
    with pytest.raises(DecoderError, match="not found"):
        EarlyExitDecoder(tiny_llama, threshold=f"calibrated:{tmp_path / 'none'}")


def test_regress_accepts_calibrated_thresholds(calibrated, tmp_path):
    cfg = tmp_path / "r.toml"
    cfg.write_text(f'''target = "tiny-llama"
[[candidates]]
name = "ee-cal"
decoder = "early-exit"
kind = "lossy"
options = {{ threshold = "calibrated:{calibrated}" }}
[suites.factual]
margin = 0.5
[profiles.smoke]
suites = ["factual"]
max_new_tokens = 8
''')
    rc = main(["regress", "--config", str(cfg), "--run-dir", str(tmp_path / "run"), "--no-tracking", "--no-progress"])
    assert rc in (0, 1)   # the verdict on a random model is not the point; running it is
    rows = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert {r["stats"].get("calibration") for r in rows if r["candidate"] == "ee-cal"} == {f"calibrated:{calibrated}"}


# ------------------------------------------------------------------------------------ frontier

@pytest.mark.full  # every point of the frontier measured, a figure drawn and logged to MLflow (8 s)
def test_frontier_reports_every_point_and_draws_the_figure(heads_dir, calibrated, tmp_path, mlflow_sqlite):
    run_dir = tmp_path / "fr"
    assert main(["exit-frontier", "--target", "tiny-llama", "--exit-heads", str(heads_dir), "--calibrated",
                 str(calibrated), "--thresholds", "0.2,0.1", "--suites", "factual,refusal", "--max-new-tokens", "8",
                 "--run-dir", str(run_dir), "--tracking-uri", mlflow_sqlite, "--no-progress"]) == 0
    res = json.loads((run_dir / "frontier.json").read_text())
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=mlflow_sqlite)
    run = client.search_runs([client.get_experiment_by_name("decodegate-exit-frontier").experiment_id])[0]
    assert "ee-heads-0.1.measured_speedup" in run.data.metrics
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"frontier.json", "frontier.png"}
    names = [p["name"] for p in res["points"]]
    assert names == ["ee-lens-0.2", "ee-heads-0.2", "ee-lens-0.1", "ee-heads-0.1", "ee-calibrated-1"]
    for p in res["points"]:
        assert 1 <= p["avg_layers"] <= 4 and p["theoretical_speedup"] > 0 and p["measured_speedup"] > 0
        assert 0 <= p["prefix_agreement"] <= 1 and set(p["quality"]) == {"factual", "refusal"}
        lo, hi = p["quality"]["factual"]["ci"]
        assert lo <= p["quality"]["factual"]["delta"] <= hi
    assert (run_dir / "figures" / "frontier.png").stat().st_size > 1000
    # A lower threshold exits earlier.
    by = {p["name"]: p for p in res["points"]}
    assert by["ee-lens-0.1"]["avg_layers"] <= by["ee-lens-0.2"]["avg_layers"]


def test_pareto_front():
    from harness.exits.frontier import pareto_front
    assert pareto_front([(1.2, -0.1), (1.1, -0.2), (0.9, 0.0), (1.0, 0.0), (1.3, None)]) == {0, 3}


def test_train_exits_bad_input_exits_2(capsys):
    assert main(["train-exits", "--target", "tiny-llama", "--layers", "0,9"]) == 2
    assert "--layers" in capsys.readouterr().err
    assert build_parser().parse_args(["train-exits"]).target == "smollm2-135m"
