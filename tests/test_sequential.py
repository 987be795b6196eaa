"""Group-sequential quality gates (analysis/sequential.py): boundaries against published values and
their defining property, exact operating figures against simulation, the level over a grid, the
naive repeated test that must break it, early stopping of a clearly worse candidate, look sizes.

Tolerances: Monte Carlo checks at 4 standard errors (of the exact value where one is known).
"""

from functools import lru_cache

import numpy as np
import pytest
from scipy import stats

from harness.calibration import paired_tests as cal
from harness.calibration import report as calreport
from harness.calibration import sequential as cs
from analysis import sequential as seq

ALPHA, LOSS_ALPHA, MARGIN = 0.05, 0.05 / 3, 0.10
NS = (20, 30, 45, 60, 90, 120, 217, 300)
DISCS = (0.1, 0.15, 0.2, 0.3, 0.4, 0.6)


@lru_cache(maxsize=None)
def plan(spending="obrien-fleming", looks=3, alpha=ALPHA, loss_alpha=LOSS_ALPHA):
    return seq.Plan.make(looks, alpha, loss_alpha, spending)


def naive(looks=3):
    return seq.Plan(seq.fractions(looks), ALPHA, LOSS_ALPHA, "naive", (float(stats.norm.ppf(1 - ALPHA)),) * looks,
                    (float(stats.norm.ppf(1 - LOSS_ALPHA)),) * looks)


# ------------------------------------------------------------------------------ boundaries


@pytest.mark.parametrize("alpha", [0.01, 0.025, 0.05, 0.05 / 3])
def test_one_look_is_the_fixed_design(alpha):
    assert seq.boundaries((1.0,), alpha) == pytest.approx((stats.norm.ppf(1 - alpha),), abs=1e-12)
    p = seq.Plan.make(1, alpha, alpha / 2)
    assert p.ni_bounds[0] == pytest.approx(stats.norm.ppf(1 - alpha), abs=1e-12)
    assert p.loss_bounds[0] == pytest.approx(stats.norm.ppf(1 - alpha / 2), abs=1e-12)


@pytest.mark.parametrize("alpha,spending,published", [
    # Lan-DeMets O'Brien-Fleming-type spending, 3 equally spaced looks (gsDesign / ldbounds / East).
    # Not the classical O'Brien-Fleming boundaries (3.471, 2.454, 2.004 at 0.025), which are the
    # constant shape c*sqrt(K/k) and spend more at the first look.
    (0.05, "obrien-fleming", (3.200, 2.141, 1.695)),
    (0.025, "obrien-fleming", (3.710, 2.511, 1.993)),
    # Lan-DeMets Pocock-type spending alpha*ln(1 + (e - 1) t)
    (0.025, "pocock", (2.279, 2.295, 2.296)),
])
def test_published_boundaries(alpha, spending, published):
    assert seq.boundaries(seq.fractions(3), alpha, spending) == pytest.approx(published, abs=2e-3)


def test_classical_obrien_fleming_is_not_what_is_spent():
    """The first Lan-DeMets boundary at 0.025 is well above the classical 3.471: a different plan."""
    assert seq.boundaries(seq.fractions(3), 0.025)[0] > 3.471 + 0.2


def _no_cross_prob(fracs, bounds):
    """P(Z_1 < c_1, ..., Z_k < c_k) for each k from the multivariate normal (Genz), independent of the
    module's grid integration."""
    t = np.asarray(fracs)
    corr = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    return np.array([stats.multivariate_normal(np.zeros(k), corr[:k, :k]).cdf(np.asarray(bounds[:k]))
                     if k > 1 else stats.norm.cdf(bounds[0]) for k in range(1, len(t) + 1)])


@pytest.mark.parametrize("spending", seq.SPENDING)
@pytest.mark.parametrize("alpha,looks", [(0.05, 3), (0.025, 3), (0.05 / 3, 4)])
def test_boundaries_spend_what_the_function_allots(spending, alpha, looks):
    fracs = seq.fractions(looks)
    bounds = seq.boundaries(fracs, alpha, spending)
    target = np.asarray(seq.spent(np.asarray(fracs), alpha, spending))
    per_look, total = seq.crossing(fracs, bounds, 0.0)
    assert np.cumsum(per_look) == pytest.approx(target, abs=1e-6)
    assert total == pytest.approx(alpha, abs=1e-6)
    assert 1 - _no_cross_prob(fracs, bounds) == pytest.approx(target, abs=2e-5)


@pytest.mark.parametrize("spending", seq.SPENDING)
def test_boundaries_by_brownian_motion(spending):
    """200k Brownian paths at the looks: the first crossing at each look has the spent probability."""
    fracs, alpha, paths = seq.fractions(3), 0.05, 200_000
    bounds = np.asarray(seq.boundaries(fracs, alpha, spending))
    rng = np.random.default_rng(11)
    dt = np.diff((0.0,) + fracs)
    s = np.cumsum(rng.standard_normal((paths, len(fracs))) * np.sqrt(dt), axis=1)
    crossed = s / np.sqrt(fracs) >= bounds
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    target = np.diff((0.0,) + tuple(seq.spent(np.asarray(fracs), alpha, spending)))
    for k, p in enumerate(target):
        assert abs(np.mean(first == k) - p) <= 4 * np.sqrt(p * (1 - p) / paths), (k, p)
    # and with a drift, against the module's own integration
    theta = 2.0
    s_drift = s + theta * np.asarray(fracs)
    hit = (s_drift / np.sqrt(fracs) >= bounds).any(axis=1).mean()
    power = seq.crossing(fracs, tuple(bounds), theta)[1]
    assert abs(hit - power) <= 4 * np.sqrt(power * (1 - power) / paths)


def test_bad_arguments():
    with pytest.raises(ValueError):
        seq.boundaries((0.5, 0.5, 1.0), 0.05)
    with pytest.raises(ValueError):
        seq.boundaries((0.5, 0.9), 0.05)
    with pytest.raises(ValueError):
        seq.spent(0.5, 0.05, "haybittle")
    with pytest.raises(ValueError):
        seq.fractions(0)
    with pytest.raises(ValueError):
        seq.exact_operating(plan(), 60, 0.1, -0.2, MARGIN)  # 10% discordant cannot hold a 20-point loss


# ----------------------------------------------------------------------- exact operating figures


def simulate(p, n, disc, delta, margin, studies, rng):
    """Item by item: each pair a win, loss or tie; counts at the look sizes; the module's z and decide."""
    rng = np.random.default_rng(rng)
    p_win, p_loss = (disc + delta) / 2, (disc - delta) / 2
    outcome = rng.choice(3, size=(studies, n), p=[p_win, p_loss, 1 - p_win - p_loss])
    wins, losses = np.cumsum(outcome == 0, axis=1), np.cumsum(outcome == 1, axis=1)
    sizes = p.look_sizes(n)
    z = [seq.binary_z(wins[:, nk - 1], losses[:, nk - 1], nk, margin) for nk in sizes]
    counts = {"non-inferior": 0, "worse": 0, None: 0}
    items = 0
    for i in range(studies):
        for k, nk in enumerate(sizes):
            verdict = seq.decide(p, k, float(z[k][0][i]), float(z[k][1][i]))
            if verdict is not None or k == len(sizes) - 1:
                counts[verdict] += 1
                items += nk
                break
    return counts["non-inferior"] / studies, counts["worse"] / studies, items / studies


@pytest.mark.parametrize("design,n,disc,delta", [
    ("obrien-fleming", 60, 0.3, -MARGIN),
    ("obrien-fleming", 150, 0.4, 0.0),
    ("pocock", 120, 0.5, -2 * MARGIN),
    ("naive", 217, 0.5, -MARGIN),
])
def test_exact_operating_agrees_with_simulation(design, n, disc, delta):
    p = naive() if design == "naive" else plan(design)
    ex = seq.exact_operating(p, n, disc, delta, MARGIN)
    assert ex.non_inferior + ex.worse + ex.inconclusive == pytest.approx(1.0, abs=1e-9)
    assert sum(ex.stop_at) == pytest.approx(1.0, abs=1e-9)
    studies = 20_000
    ni, worse, items = simulate(p, n, disc, delta, MARGIN, studies, rng=n)
    for sim, exact in ((ni, ex.non_inferior), (worse, ex.worse)):
        assert abs(sim - exact) <= 4 * np.sqrt(max(exact * (1 - exact), 1e-12) / studies) + 1e-9, (sim, exact)
    sizes = np.asarray(p.look_sizes(n), dtype=float)
    sd_items = np.sqrt(max(float(np.dot(ex.stop_at, sizes ** 2)) - ex.expected_n ** 2, 1e-12))
    assert abs(items - ex.expected_n) <= 4 * sd_items / np.sqrt(studies) + 1e-9, (items, ex.expected_n)
    # the calibration's own (vectorised) simulation agrees too
    cal_sim = cs.simulate_operating(p, n, disc, delta, MARGIN, studies=5000, rng=1)
    assert abs(cal_sim.non_inferior - ex.non_inferior) <= 4 * cal_sim.se(ex.non_inferior) + 1e-9
    assert abs(cal_sim.expected_n - ex.expected_n) <= 4 * cal_sim.expected_n_se + 1e-9


@pytest.mark.parametrize("n,disc", [(60, 0.2), (217, 0.3), (300, 0.5)])
def test_one_look_plan_is_the_gates_fixed_test(n, disc):
    """Plan.make(1) with binary_z is the fixed Tango test of analysis.paired (p < alpha)."""
    fixed = seq.exact_operating(plan(looks=1), n, disc, -MARGIN, MARGIN)
    assert fixed.non_inferior == pytest.approx(cal.ni_pass_rate(n, -MARGIN, MARGIN, disc, studies=1000).exact,
                                               abs=1e-12)
    assert fixed.expected_n == pytest.approx(n)


def _grid(p, delta, attr):
    return {(n, d): getattr(seq.exact_operating(p, n, d, delta, MARGIN), attr) for n in NS for d in DISCS}


@pytest.mark.parametrize("spending", seq.SPENDING)
def test_sequential_plan_holds_the_level(spending):
    ni = _grid(plan(spending), -MARGIN, "non_inferior")
    worse = _grid(plan(spending), 0.0, "worse")
    assert max(ni.values()) <= ALPHA, max(ni.items(), key=lambda kv: kv[1])
    assert max(worse.values()) <= LOSS_ALPHA, max(worse.items(), key=lambda kv: kv[1])
    assert max(ni.values()) > 0.04  # and is not so conservative as to be useless


def test_naive_repeated_test_breaks_the_level():
    """Testing at the fixed z at every look: the check above must be able to fail."""
    ni = _grid(naive(), -MARGIN, "non_inferior")
    worse = _grid(naive(), 0.0, "worse")
    assert max(ni.values()) > 0.07
    assert max(worse.values()) > 1.5 * LOSS_ALPHA
    assert sum(v > ALPHA for v in ni.values()) >= len(ni) // 2


def test_obf_costs_little_power():
    for n, disc in ((120, 0.2), (217, 0.3), (300, 0.5)):
        fixed = seq.exact_operating(plan(looks=1), n, disc, 0.0, MARGIN).non_inferior
        obf = seq.exact_operating(plan(), n, disc, 0.0, MARGIN)
        poc = seq.exact_operating(plan("pocock"), n, disc, 0.0, MARGIN)
        assert fixed - 0.015 <= obf.non_inferior and poc.non_inferior < obf.non_inferior
        assert obf.expected_n < 0.95 * n and poc.expected_n < obf.expected_n


def test_clearly_worse_candidate_stops_early():
    n, disc, delta = 150, 0.4, -0.3
    obf = seq.exact_operating(plan(), n, disc, delta, MARGIN)
    poc = seq.exact_operating(plan("pocock"), n, disc, delta, MARGIN)
    for op in (obf, poc):
        assert op.worse > 0.999 and op.expected_n < 0.65 * n
    # Pocock spends enough at the first look to stop there most of the time; O'Brien-Fleming keeps its
    # first-look loss boundary near z = 4 (loss_alpha 0.05/3) and stops there rarely, but by the second
    # look almost always
    assert poc.stop_at[0] > 0.5
    assert obf.stop_at[0] < poc.stop_at[0] and obf.stop_at[0] + obf.stop_at[1] > 0.95
    fixed = seq.exact_operating(plan(looks=1), n, disc, delta, MARGIN)
    assert fixed.expected_n == pytest.approx(n) and fixed.worse == pytest.approx(obf.worse, abs=1e-4)


# ------------------------------------------------------------------------------- look sizes


@pytest.mark.parametrize("looks", [1, 2, 3, 4, 5])
def test_look_sizes(looks):
    p = seq.Plan(seq.fractions(looks), ALPHA, LOSS_ALPHA, "naive", (2.0,) * looks, (2.5,) * looks)
    for n in range(looks, 400):
        sizes = p.look_sizes(n)
        assert len(sizes) == looks and sizes[-1] == n and sizes[0] >= 1
        assert all(b > a for a, b in zip(sizes, sizes[1:])), (n, sizes)
        assert all(abs(s - t * n) <= max(1, looks) for s, t in zip(sizes, p.fracs)), (n, sizes)
    assert p.look_sizes(300) == tuple(round(300 * (k + 1) / looks) for k in range(looks))


def test_look_sizes_need_as_many_items_as_looks():
    with pytest.raises(ValueError):
        plan().look_sizes(2)
    with pytest.raises(ValueError):
        plan(looks=1).look_sizes(0)
    assert plan().look_sizes(3) == (1, 2, 3)


# ------------------------------------------------------------------------- CALIBRATION.md


def test_calibration_section_and_only_option(tmp_path):
    lines = cs.report_lines(studies=1000, rng=0, grid_size="small")  # the full grid is `make calibrate`'s
    text = "\n".join(lines)
    assert cs.HEADING in text and "naive" in text and "Simulated cross-check" in text
    assert "| 217 | 0.3 |" in text and "| 120 |" not in text
    out = tmp_path / "CALIBRATION.md"
    out.write_text("# Calibration\n\n## Earlier\n\nbody\n")
    assert calreport.main(["--studies", "1000", "--grid", "small", "--only", "sequential", "--out", str(out)]) == 0
    once = out.read_text()
    assert once.startswith("# Calibration\n\n## Earlier\n\nbody\n\n" + cs.HEADING)
    out.write_text(once + "\n## Later\n\nkept\n")
    assert calreport.main(["--studies", "1000", "--grid", "small", "--only", "sequential", "--out", str(out)]) == 0
    assert out.read_text() == once + "\n## Later\n\nkept\n"  # replaced in place, the rest kept
    with pytest.raises(SystemExit):
        calreport.main(["--studies", "1000", "--only", "sequential", "--out", str(tmp_path / "missing.md")])


# ---------------------------------------------------------------- the plan printed before a run


def test_sample_size_plan_uses_the_profiles_looks():
    """The decide profile runs 3 looks: the plan's needed n and P(pass) are the sequential plan's exact
    operating figures (the gate's boundaries and loss level), not the fixed design's n times an
    inflation factor, which asked for 147 items at discordance 0.2 where 141 give 80%."""
    from harness.config import load_config
    from harness.run import runner
    from harness.verdict import power
    config = load_config("regress.toml", "decide")
    assert config.profile.looks == 3
    p = power.plan(config, runner.load_suites(config))
    gate_plan = seq.Plan.make(3, ALPHA, ALPHA / 3, "obrien-fleming")
    assert p["rows"] and {r["suite"] for r in p["rows"]} == {"factual", "code", "refusal"}
    for r in p["rows"]:
        exact = seq.exact_operating(gate_plan, r["planned"], r["discordance"], 0.0, r["margin"]).non_inferior
        assert r["pass_probability"] == pytest.approx(exact, abs=1e-12)
        fixed = seq.exact_operating(plan(looks=1), r["planned"], r["discordance"], 0.0, r["margin"]).non_inferior
        assert exact < fixed  # the looks cost power, and the plan now says so
        need = r["needed"]
        assert seq.exact_operating(gate_plan, need, r["discordance"], 0.0, r["margin"]).non_inferior >= 0.8
        assert seq.exact_operating(gate_plan, need - 1, r["discordance"], 0.0, r["margin"]).non_inferior < 0.8
        assert r["decides"] == (r["planned"] >= need)
    assert {r["needed"] for r in p["rows"]} == {141}
    text = power.table(p, config)
    assert "P(pass)" in text and "looks included" in text
    code = next(line for line in text.splitlines() if " code " in line)
    assert f"{p['rows'][1]['pass_probability']:.3f}" in code and "cannot decide: about 141 items would" in code


def test_prompts_that_all_lose_alike_are_not_worse_at_the_first_look():
    """Clustered pairs (two seeds per item), the first look's two items both lost: the paired-t loss
    p-value was 0 (z_loss 37) and the run stopped 'worse at look 1' (red-team). The sign test gives
    0.5**2 at look 1."""
    from analysis.pairing import Pair, PairKey
    from harness.verdict.looks import evaluate
    p = seq.Plan.make(3, 0.05, 0.05, "obrien-fleming")
    items = [f"i{i}" for i in range(6)]
    sets = [set(items[:n]) for n in p.look_sizes(len(items))]
    pairs = [Pair(PairKey("s", "h", it, s, 0.0), {"passed": True}, {"passed": False}) for it in items for s in range(2)]
    res = evaluate(p, sets, pairs, 0.1, 0.05)
    first = res["looks"][0]
    assert first["z_loss"] == pytest.approx(float(stats.norm.isf(0.25)))
    assert (res["decided"], res["look"]) != ("worse", 1)


def test_binary_z_loss_needs_the_exact_sign_test_with_few_discordant_pairs():
    """As analysis.paired.tango_loss_pvalue: 4 losses of 4 discordant pairs are not z = 1.96."""
    from analysis.paired import tango_loss_pvalue
    w, l = np.array([0, 0, 3]), np.array([4, 7, 30])
    _, z_loss = seq.binary_z(w, l, 60, MARGIN)
    assert z_loss == pytest.approx(stats.norm.isf(tango_loss_pvalue(w, l, 60)))
    assert z_loss[0] == pytest.approx(stats.norm.isf(0.0625))


def test_an_item_graded_none_does_not_hold_a_look_open():
    """Issue 49 (4): one item graded `none` in a gated suite kept the look that holds it from ever
    being reached; the suite ended inconclusive (a fail) and the message said the candidate "was
    stopped elsewhere", though nothing stopped it. All other pairs agree: a pass without looks."""
    from harness.config import Gates, load_config
    from harness.run import runner
    from harness.verdict.gate import decide
    from harness.verdict.summary import _sequential
    from analysis.pairing import Pair, PairKey
    from harness.verdict import looks
    config = load_config("regress.toml", "decide")
    spec = next(s for s in config.candidates if s.kind == "lossy")
    suite = next(s for s in runner.load_suites(config) if s.name == "factual")
    order = [it.id for it in looks.item_order(suite, config.profile.subset)]
    ungraded = order[0]  # in the first look
    pairs = [Pair(PairKey("factual", suite.hash, it, 0, 0.0), {"passed": True},
                  {"passed": None if it == ungraded else True}) for it in order]
    seq = _sequential(config, spec, suite, pairs)
    assert seq["look"] >= 1 and seq["decided"] == "non-inferior"
    q = {"n": len(order) - 1, "non_inferiority": {"margin": 0.1}, "sequential": seq}
    cand = {"kind": "lossy", "decoder": "early-exit", "options": {}, "suites": {"factual": {"quality": q}}}
    assert decide(cand, Gates()).passed
    # A look not reached without a stop row is not called "stopped"
    short = dict(seq, decided=None, look=1, looks=seq["looks"][:1])
    res = decide(dict(cand, suites={"factual": {"quality": dict(q, sequential=short)}}), Gates())
    detail = next(r.detail for r in res.results if r.name.startswith("quality"))
    assert "stopped" not in detail and "look 2 was not reached" in detail
    stop = {"candidate": "c", "suite": "factual", "reason": "non-inferior", "look": 1, "detail": "factual stopped"}
    res = decide(dict(cand, suites={"factual": {"quality": dict(q, sequential=short)}}, stopped=[stop]), Gates())
    assert "stopped elsewhere: factual stopped" in next(r.detail for r in res.results if r.name.startswith("quality"))
