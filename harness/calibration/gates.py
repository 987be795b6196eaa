"""Calibration of what the gate says: verdicts under A/A, interval coverage, exactness power.

Part of ``python -m harness.calibration.report`` (tables in ``harness/calibration/CALIBRATION.md``); the tests call
the same functions with fewer studies.

- :func:`aa_any_worse`: P(any of a candidate's suites called "worse") when nothing changed, through
  the gate's own decision (:func:`gate_verdict`: "worse" needs non-inferiority not shown and the
  loss test rejecting at alpha / suites; with looks, the group-sequential plan the gate runs), for
  the loss test alone and for the old rule (point estimate below -margin, or McNemar p < alpha with
  a loss). Exact, from the trinomial distribution of (wins, losses) per suite (suites are
  independent: they hold different prompts), and simulated.
- :func:`aa_pass_all`: P(an unchanged candidate passes every suite), each suite at alpha
  (intersection-union; fixed design or the profile's looks) against Holm across the suites.
- the speed gate's bound: :mod:`.speed` (its section of the report comes from there).
- :func:`p95_below_truth`, :func:`p95_coverage`: bias of the p95 estimate at small n and coverage
  of its order-statistic interval.
- :func:`pit_rejection`, :func:`gof_rejection`: size and power of the sequential PIT test
  (``analysis.pit``) and of the sequence goodness of fit, against distortions of a given total
  variation per distorted position, in four shapes: ``top-two`` (mass moved from the likeliest
  token to the second), ``spread`` (towards uniform over the support), ``sharpen`` (a lower
  temperature) and ``id-shift`` (the lowest-id tokens of the support lose mass, as a sampler that
  reuses a uniform does). Synthetic target rows: a mixture of near-certain steps and Zipf-like ones,
  the vocabulary permuted so that ids say nothing about rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from analysis import pit
from analysis.exactness import goodness_of_fit
from analysis.latency import PERCENTILE_METHOD, quantile_interval
from analysis import sequential as seq
from analysis.paired import mcnemar_pvalue, tango_loss_pvalue, tango_ni_pvalue

from . import speed
from .common import ALPHA, Rate, pick, trinomial_grid
from .sequential import simulate_operating

SHAPES = ("top-two", "spread", "sharpen", "id-shift")


# ------------------------------------------------------------------------------ verdicts


PASS, WORSE, INCONCLUSIVE = 0, 1, 2


def gate_verdict(wins, losses, n: int, *, margin: float = 0.10, alpha: float = ALPHA, suites: int = 3):
    """The gate's fixed-design verdict on one suite's pass/fail counts, vectorised: PASS when
    non-inferiority is shown (``tango_ni_pvalue < alpha``, which is what
    ``NonInferiorityResult.passed`` is), else WORSE when the loss test rejects at alpha / suites
    (the gate's ``loss_upper_bound`` below 0 is that test inverted), else INCONCLUSIVE.
    tests/test_analysis_calibration.py checks it against ``harness.verdict.gate.decide``."""
    w, l = np.asarray(wins), np.asarray(losses)
    ni = tango_ni_pvalue(w, l, n, margin=margin) < alpha
    loss = tango_loss_pvalue(w, l, n) < alpha / suites
    return np.where(ni, PASS, np.where(loss, WORSE, INCONCLUSIVE))


def _loss_alone(n: int, suites: int, alpha: float):
    """The loss test without the non-inferiority test before it (what this table once counted)."""
    return lambda w, l: tango_loss_pvalue(w, l, n) < alpha / suites


def _old_worse(n: int, margin: float, alpha: float):
    def rule(w, l):
        delta = (np.asarray(w) - np.asarray(l)) / n
        return (delta < -margin) | ((mcnemar_pvalue(l, w) < alpha) & (delta < 0))
    return rule


def _per_suite(n, disc, rule, studies, rng, suites) -> tuple[np.ndarray, float]:
    """Simulated (studies, suites) decisions and the exact per-suite rate."""
    draws = rng.multinomial(n, [disc / 2, disc / 2, 1 - disc], size=(studies, suites))
    w, l, pmf = trinomial_grid(n, disc / 2, disc / 2)
    return rule(draws[..., 0], draws[..., 1]), float(np.sum(pmf * rule(w, l)))


def aa_any_worse(n: int, disc: float, *, suites: int = 3, margin: float = 0.10, alpha: float = ALPHA,
                 rule: str = "gate", looks: int = 1, spending: str = "obrien-fleming", studies: int = 10_000,
                 rng=None) -> Rate:
    """P(any suite "worse") with no true change; ``disc`` = P(a pair is discordant). ``rule``:
    "gate" (:func:`gate_verdict`; with ``looks`` > 1 the gate's group-sequential plan, exactly by
    :func:`analysis.sequential.exact_operating` and simulated as the gate decides look by look),
    "loss-alone" (:func:`_loss_alone`) or "old" (point estimate below -margin, or McNemar)."""
    rng = np.random.default_rng(rng)
    if rule == "gate" and looks > 1:
        plan = seq.Plan.make(looks, alpha, alpha / suites, spending)
        per = seq.exact_operating(plan, n, disc, 0.0, margin).worse
        sim = [simulate_operating(plan, n, disc, 0.0, margin, studies=studies, rng=rng) for _ in range(suites)]
        hits = np.stack([s.verdicts == "worse" for s in sim], axis=1)
        return Rate(float(np.mean(hits.any(axis=1))), studies, 1.0 - (1.0 - per) ** suites)
    fn = {"gate": lambda w, l: gate_verdict(w, l, n, margin=margin, alpha=alpha, suites=suites) == WORSE,
          "loss-alone": _loss_alone(n, suites, alpha), "old": _old_worse(n, margin, alpha)}[rule]
    sim, per = _per_suite(n, disc, fn, studies, rng, suites)
    return Rate(float(np.mean(sim.any(axis=1))), studies, 1.0 - (1.0 - per) ** suites)


def aa_pass_all(sizes, disc: float, *, margin: float = 0.10, alpha: float = ALPHA, holm: bool = False,
                looks: int = 1, spending: str = "obrien-fleming", studies: int = 10_000, rng=None) -> Rate:
    """P(every suite passes) with no true change; suites of the given sizes. The gate's rule (each
    suite non-inferior at alpha; with ``looks`` > 1 its group-sequential plan, the loss test at
    alpha / suites), or ``holm`` across the suites (simulated only; the fixed design)."""
    rng = np.random.default_rng(rng)
    m = len(sizes)
    if looks > 1:
        plan = seq.Plan.make(looks, alpha, alpha / m, spending)
        exact = float(np.prod([seq.exact_operating(plan, n, disc, 0.0, margin).non_inferior for n in sizes]))
        sim = [simulate_operating(plan, n, disc, 0.0, margin, studies=studies, rng=rng).verdicts == "non-inferior"
               for n in sizes]
        return Rate(float(np.mean(np.all(np.stack(sim, axis=1), axis=1))), studies, exact)
    pvals, passed, exact = [], [], 1.0
    for n in sizes:
        draws = rng.multinomial(n, [disc / 2, disc / 2, 1 - disc], size=studies)
        pvals.append(tango_ni_pvalue(draws[:, 0], draws[:, 1], n, margin=margin))
        passed.append(gate_verdict(draws[:, 0], draws[:, 1], n, margin=margin, alpha=alpha, suites=m) == PASS)
        w, l, pmf = trinomial_grid(n, disc / 2, disc / 2)
        exact *= float(np.sum(pmf * (gate_verdict(w, l, n, margin=margin, alpha=alpha, suites=m) == PASS)))
    if holm:  # every hypothesis rejected: p_(j) <= alpha / (m - j) for j = 0..m-1
        p = np.sort(np.stack(pvals, axis=1), axis=1)
        return Rate(float(np.mean(np.all(p <= alpha / (m - np.arange(m)), axis=1))), studies, None)
    return Rate(float(np.mean(np.all(np.stack(passed, axis=1), axis=1))), studies, exact)


# ----------------------------------------------------------------------------------- p95


def p95_below_truth(n: int, *, method: str = PERCENTILE_METHOD, studies: int = 10_000, rng=None) -> Rate:
    """P(p95 estimate < true p95) for log-normal latencies."""
    rng = np.random.default_rng(rng)
    truth = float(np.exp(stats.norm.ppf(0.95) * 0.5))
    x = rng.lognormal(0.0, 0.5, size=(studies, n))
    est = np.percentile(x, 95, axis=1, method=method)
    return Rate(float(np.mean(est < truth)), studies, None)


def p95_coverage(n: int, *, studies: int = 2000, rng=None) -> tuple[Rate, float]:
    """(coverage of the 95% order-statistic interval's lower end as a one-sided bound, or of the
    two-sided interval where both ends exist; share of samples with an upper end)."""
    rng = np.random.default_rng(rng)
    truth = float(np.exp(stats.norm.ppf(0.95) * 0.5))
    hits, upper = 0, 0
    for _ in range(studies):
        ci = quantile_interval(rng.lognormal(0.0, 0.5, n), 0.95)
        has_high = np.isfinite(ci.high)
        upper += has_high
        hits += (ci.low <= truth) and (not has_high or truth <= ci.high)
    return Rate(hits / studies, studies, None), upper / studies


# -------------------------------------------------------------------------- exactness


def lm_rows(t: int, v: int, rng) -> np.ndarray:
    """(t, v) synthetic next-token distributions: 40% near-certain steps, the rest Zipf-like with
    exponents 0.8-2.5; the vocabulary permuted per row."""
    a = rng.uniform(0.8, 2.5, size=t)
    p = np.arange(1, v + 1, dtype=float)[None, :] ** (-a[:, None])
    sure = rng.random(t) < 0.4
    p[sure, 0] = p[sure, 1:].sum(axis=1) * rng.uniform(10, 500, sure.sum())
    p /= p.sum(axis=1, keepdims=True)
    return np.take_along_axis(p, rng.permuted(np.tile(np.arange(v), (t, 1)), axis=1), axis=1)


def _sharpen(p: np.ndarray, tv: float) -> np.ndarray:
    lo, hi = np.ones(len(p)), np.full(len(p), 8.0)
    logp = np.log(np.maximum(p, 1e-300))
    for _ in range(40):
        beta = (lo + hi) / 2
        q = np.exp((logp - logp.max(axis=1, keepdims=True)) * beta[:, None])
        q /= q.sum(axis=1, keepdims=True)
        small = 0.5 * np.abs(q - p).sum(axis=1) < tv
        lo, hi = np.where(small, beta, lo), np.where(small, hi, beta)
    return q


def distort(p: np.ndarray, tv: float, shape: str) -> np.ndarray:
    """Rows of p moved by total variation up to ``tv`` (less where a row cannot move that far)."""
    q = p.copy()
    rows = np.arange(len(p))
    if shape == "top-two":
        order = np.argsort(-p, axis=1)
        d = np.minimum(tv, p[rows, order[:, 0]])
        q[rows, order[:, 0]] -= d
        q[rows, order[:, 1]] += d
    elif shape == "spread":
        support = p > 0
        u = support / support.sum(axis=1, keepdims=True)
        lam = np.minimum(tv / np.maximum(0.5 * np.abs(p - u).sum(axis=1), 1e-12), 1.0)
        q = (1 - lam[:, None]) * p + lam[:, None] * u
    elif shape == "sharpen":
        q = _sharpen(p, tv)
    elif shape == "id-shift":
        cum = np.cumsum(p, axis=1)
        cut = np.minimum(p, np.clip(tv - (cum - p), 0, None))   # the first tv of mass in id order
        q = p - cut
        q /= q.sum(axis=1, keepdims=True)
    else:
        raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
    return q


def _draw(q: np.ndarray, rng) -> np.ndarray:
    cum = np.cumsum(q, axis=1)
    return np.minimum((cum < rng.random(len(q))[:, None] * cum[:, -1:]).sum(axis=1), q.shape[1] - 1)


def pit_rejection(n_tokens: int, tv: float = 0.0, shape: str = "top-two", *, share: float = 1.0,
                  level: float = 0.01, vocab: int = 64, studies: int = 1000, rng=None) -> Rate:
    """Rejection rate of :func:`analysis.pit.pit_test` at ``level`` over n_tokens tokens, a share of
    them drawn from a distortion of TV ``tv`` (tv = 0: the size)."""
    rng = np.random.default_rng(rng)
    hits = 0
    for _ in range(studies):
        p = lm_rows(n_tokens, vocab, rng)
        q = p.copy()
        if tv > 0:
            moved = rng.random(n_tokens) < share
            q[moved] = distort(p[moved], tv, shape)
        res = pit.pit_test(pit.features(p, _draw(q, rng)), level=level, rng=rng)
        hits += res.pvalue is not None and res.pvalue < level
    return Rate(hits / studies, studies, None)


def _sequence_probs(k: int, rng) -> np.ndarray:
    """A distribution over k three-token sequences (Zipf-like, exponent 1-1.5), ids permuted."""
    p = np.arange(1, k + 1, dtype=float) ** (-rng.uniform(1.0, 1.5))
    return rng.permutation(p / p.sum())


def gof_rejection(n_samples: int, tv: float = 0.0, shape: str = "top-two", *, level: float = 0.01,
                  k: int = 300, studies: int = 2000, rng=None) -> Rate:
    """Rejection rate of :func:`analysis.exactness.goodness_of_fit` (pooled as the harness pools)
    for n_samples sampled sequences from a distortion of TV ``tv``."""
    rng = np.random.default_rng(rng)
    hits = 0
    for _ in range(studies):
        p = _sequence_probs(k, rng)
        q = distort(p[None], tv, shape)[0] if tv > 0 else p
        counts = rng.multinomial(n_samples, q)
        samples = np.repeat(np.arange(k), counts)
        try:
            hits += goodness_of_fit(samples, dict(enumerate(p))).pvalue < level
        except ValueError:
            pass
    return Rate(hits / studies, studies, None)


# -------------------------------------------------------------------------------- report


def _cell(rate: Rate) -> str:
    exact = f"{rate.exact:.4f}" if rate.exact is not None else "-"
    return f"{exact} / {rate.simulated:.4f} ± {1.96 * rate.mc_se:.4f}"


def _pct(rate: Rate) -> str:
    return f"{rate.simulated:.2f}"


def _rate(rate: Rate, digits: int = 3) -> str:
    return f"{rate.simulated:.{digits}f} ± {1.96 * rate.mc_se:.{digits}f}"


def report_lines(*, studies: int = 10_000, rng=None, pit_studies: int = 500, grid: str = "full") -> list[str]:
    """The markdown sections of CALIBRATION.md on the gate's verdicts and the exactness checks."""
    rng = np.random.default_rng(rng)
    out = _aa_verdict_lines(studies, rng, grid) + _pass_all_lines(studies, rng, grid)
    out += speed.lines(studies=max(studies, 20_000) if grid == "full" else 1000, rng=rng,
                       designs=pick(speed.GRID, speed.SMALL, grid))
    out += _p95_lines(studies, rng, grid) + _pit_size_lines(pit_studies, rng, grid)
    out += _pit_power_lines(pit_studies, rng, grid) + _gof_lines(studies, rng, grid)
    return out


def _aa_verdict_lines(studies: int, rng, grid: str) -> list[str]:
    """Gate verdicts under A/A: P(any of the 3 suites "worse"), exact and simulated, per rule."""
    out = [
        "",
        "## Gate verdicts under A/A: P(any of 3 suites \"worse\")",
        "",
        "No true change; `disc` = P(pair discordant), split evenly; margin 0.10. Through the gate's own "
        "decision (`gate_verdict`, checked against `harness.verdict.gate.decide`): a suite is \"worse\" only "
        "when non-inferiority is not shown (Tango at alpha) and the one-sided Tango test of a loss rejects "
        "at alpha/3 (Bonferroni over the candidate's suites); with 3 looks (the `decide` profile), the same "
        "two tests against O'Brien-Fleming boundaries, exactly by `analysis.sequential.exact_operating` and "
        "simulated look by look. \"Loss test alone\" counts a significant loss within the margin as worse, "
        "which the gate does not (it passes the suite); this table showed that rate before. The old rule "
        "(point estimate below -margin, or McNemar p < 0.05 with a loss) is shown for comparison. Each cell: "
        "exact / simulated ± 1.96 MC SE.",
        "",
        "| n per suite | disc | gate, fixed design | gate, 3 looks | loss test alone | old rule |",
        "|---|---|---|---|---|---|",
    ]
    for n in pick((10, 100, 200), (100,), grid):
        for disc in pick((0.1, 0.2, 0.3, 0.5), (0.1,), grid):
            cells = [aa_any_worse(n, disc, studies=studies, rng=rng),
                     aa_any_worse(n, disc, looks=3, studies=max(1000, studies // 5), rng=rng),
                     aa_any_worse(n, disc, rule="loss-alone", studies=studies, rng=rng),
                     aa_any_worse(n, disc, rule="old", studies=studies, rng=rng)]
            out.append(f"| {n} | {disc:.1f} | " + " | ".join(_cell(c) for c in cells) + " |")
    return out


def _pass_all_lines(studies: int, rng, grid: str) -> list[str]:
    """An unchanged candidate passes every suite: intersection-union (fixed and looked) against Holm."""
    out = [
        "",
        "## An unchanged candidate passes every suite (full profile sizes 217 / 72 / 84, margin 0.10)",
        "",
        "Through the gate's decision: each suite at alpha = 0.05 (intersection-union: a candidate passes only "
        "if every suite does, so the family's false-pass rate is at most alpha without correction), in the "
        "fixed design and in the `decide` profile's 3 looks (O'Brien-Fleming, the loss test at alpha/3), "
        "against Holm across the three (fixed design). The rest is n: an inconclusive suite reports the n "
        "that would decide.",
        "",
        "| disc | gate, fixed design (exact / simulated) | gate, 3 looks (exact / simulated) | Holm (simulated) |",
        "|---|---|---|---|",
    ]
    for disc in pick((0.1, 0.2, 0.3), (0.2,), grid):
        iut = aa_pass_all((217, 72, 84), disc, studies=studies, rng=rng)
        looked = aa_pass_all((217, 72, 84), disc, looks=3, studies=max(1000, studies // 5), rng=rng)
        holm = aa_pass_all((217, 72, 84), disc, holm=True, studies=studies, rng=rng)
        out.append(f"| {disc:.1f} | {_cell(iut)} | {_cell(looked)} | {holm.simulated:.4f} ± {1.96 * holm.mc_se:.4f} |")
    return out


def _p95_lines(studies: int, rng, grid: str) -> list[str]:
    """The p95 at small n: how often it falls below the truth, and its interval's coverage."""
    out = [
        "",
        "## p95 at small n (log-normal latencies)",
        "",
        "P(estimate below the true p95) for numpy's default (linear) and the shipped median-unbiased "
        "estimator; below n = 14 any order statistic, the sample maximum included, falls below the true "
        "p95 more often than not, which is why the p95 is reported with its interval and n. The "
        "interval (order statistics) has no upper end below n = 59; coverage counts the lower end alone "
        "there.",
        "",
        "| n | linear below truth | median-unbiased below truth | interval coverage | has an upper end |",
        "|---|---|---|---|---|",
    ]
    for n in pick((10, 20, 59, 100, 400), (10, 100), grid):
        cov, upper = p95_coverage(n, studies=pick(max(1000, studies // 10), 200, grid), rng=rng)
        out.append(f"| {n} | {p95_below_truth(n, method='linear', studies=studies, rng=rng).simulated:.3f} | "
                   f"{p95_below_truth(n, studies=studies, rng=rng).simulated:.3f} | {cov.simulated:.3f} | "
                   f"{upper:.2f} |")
    return out


def _pit_size_lines(pit_studies: int, rng, grid: str) -> list[str]:
    """The sequential PIT test's size."""
    out = [
        "",
        "## Sequential PIT test (analysis/pit.py): size",
        "",
        f"Exact sampling from synthetic target rows (vocabulary 64); {4 * pit_studies:,} studies.",
        "",
        "| tokens | rejection rate at 0.01 | at 0.0025 |",
        "|---|---|---|",
    ]
    for n in pick((30, 300, 1200, 5000), (300,), grid):
        a = pit_rejection(n, level=0.01, studies=4 * pit_studies, rng=rng)
        b = pit_rejection(n, level=0.0025, studies=4 * pit_studies, rng=rng)
        out.append(f"| {n} | {a.simulated:.4f} ± {1.96 * a.mc_se:.4f} | {b.simulated:.4f} ± {1.96 * b.mc_se:.4f} |")
    return out


def _pit_power_lines(pit_studies: int, rng, grid: str) -> list[str]:
    """The sequential PIT test's power per distortion shape and TV."""
    out = [
        "",
        "## Sequential PIT test: power at level 0.0025 (0.01 over the smoke run's four checks)",
        "",
        "Every token drawn from a distortion of the given total variation (TV) of its row; the last "
        "column distorts only 30% of the tokens (the positions a verifier acts on) and tests all. "
        "Shipped token counts: the smoke profile pools about 1,200 tokens (16 sampled records of 40 "
        "tokens and 200 window samples of 3), of which a few hundred are at drafted positions; the "
        f"full profile tens of thousands. {pit_studies} studies per cell (± up to 0.045).",
        "",
        "| shape | TV | 300 tokens | 1,200 tokens | 5,000 tokens | 1,200 tokens, 30% distorted |",
        "|---|---|---|---|---|---|",
    ]
    for shape in pick(SHAPES, SHAPES[:1], grid):
        for tv in pick((0.01, 0.02, 0.05, 0.1), (0.1,), grid):
            cells = [_pct(pit_rejection(n, tv, shape, level=0.0025, studies=pit_studies, rng=rng))
                     for n in (300, 1200, 5000)]
            cells.append(_pct(pit_rejection(1200, tv, shape, share=0.3, level=0.0025, studies=pit_studies, rng=rng)))
            out.append(f"| {shape} | {tv:.2f} | " + " | ".join(cells) + " |")
    return out


def _gof_lines(studies: int, rng, grid: str) -> list[str]:
    """The sequence goodness of fit: size and power."""
    gof_studies = pick(max(1000, studies // 5), 100, grid)
    out = [
        "",
        "## Sequence goodness of fit (one window): size and power at level 0.0025",
        "",
        "Three-token sequences as a categorical over 300 sequences (Zipf-like), pooled as the harness "
        "pools (expected count >= 5); the distortion acts on the sequence distribution. Shipped counts: "
        f"200 samples per window (smoke), 1,000 (full). {gof_studies:,} studies.",
        "",
        "| shape | TV | 200 samples | 1,000 samples |",
        "|---|---|---|---|",
        f"| none (size) | 0 | {_pct(gof_rejection(200, level=0.0025, studies=gof_studies, rng=rng))} | "
        f"{_pct(gof_rejection(1000, level=0.0025, studies=gof_studies, rng=rng))} |",
    ]
    for shape in pick(SHAPES, SHAPES[:1], grid):
        for tv in pick((0.05, 0.1), (0.1,), grid):
            cells = [_pct(gof_rejection(n, tv, shape, level=0.0025, studies=gof_studies, rng=rng)) for n in (200, 1000)]
            out.append(f"| {shape} | {tv:.2f} | " + " | ".join(cells) + " |")
    return out
