"""Calibration of the group-sequential quality gates (:mod:`.sequential`) for ``CALIBRATION.md``.

Part of ``python -m harness.calibration.report`` (``--only sequential`` writes this section alone into an
existing file). Every figure is exact, from :func:`analysis.sequential.exact_operating` (the
distribution of (wins, losses) propagated from look to look); :func:`simulate_operating` checks a
few cells end to end by simulation: trinomial draws per look, cumulative counts at the look sizes,
:func:`analysis.sequential.binary_z` and :func:`analysis.sequential.decide`, as the gate runs them.

- :func:`plan`: the fixed design (one look), and three looks with O'Brien-Fleming or Pocock
  spending; built once (a plan's boundaries take up to a second) and cached;
- :func:`naive_plan`: the "test of the test", the fixed z_{1 - alpha} (and z_{1 - loss_alpha})
  at every look, which does not keep the level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import stats

from analysis import sequential as seq

from .common import pick

ALPHA = 0.05
SUITES = 3
LOSS_ALPHA = ALPHA / SUITES
MARGIN = 0.10
LOOKS = 3
NS = (30, 60, 120, 217, 300)
DISCS = (0.1, 0.2, 0.3, 0.5)
DESIGNS = ("fixed", "obrien-fleming", "pocock", "naive")
LABELS = {"fixed": "fixed", "obrien-fleming": "OBF", "pocock": "Pocock", "naive": "naive"}


HEADING = "## Group-sequential quality gates"


def rng_for(seed: int) -> np.random.Generator:
    """The section's own random stream, so that it reads the same written alone or with the rest."""
    return np.random.default_rng([seed, 7])


def splice(text: str, lines: list[str], heading: str = HEADING) -> str:
    """``text`` (a CALIBRATION.md) with the section under ``heading`` replaced by ``lines``, or appended."""
    section = "\n".join(lines).strip("\n") + "\n"
    start = text.find(heading)
    if start < 0:
        return text.rstrip("\n") + "\n\n" + section
    end = text.find("\n## ", start + len(heading))
    rest = "" if end < 0 else "\n" + text[end + 1:]
    return text[:start] + section + rest


@lru_cache(maxsize=None)
def plan(design: str, looks: int = LOOKS, alpha: float = ALPHA, loss_alpha: float = LOSS_ALPHA) -> seq.Plan:
    """"fixed" (one look), a spending function's name (``looks`` looks), or "naive"."""
    if design == "fixed":
        return seq.Plan.make(1, alpha, loss_alpha)
    if design == "naive":
        return naive_plan(looks, alpha, loss_alpha)
    return seq.Plan.make(looks, alpha, loss_alpha, design)


def naive_plan(looks: int = LOOKS, alpha: float = ALPHA, loss_alpha: float = LOSS_ALPHA) -> seq.Plan:
    """The fixed design's boundaries repeated at every look (no alpha spending)."""
    return seq.Plan(seq.fractions(looks), alpha, loss_alpha, "naive",
                    (float(stats.norm.ppf(1 - alpha)),) * looks,
                    (float(stats.norm.ppf(1 - loss_alpha)),) * looks)


def feasible(disc: float, delta: float) -> bool:
    """A change delta = P(win) - P(loss) needs at least |delta| of the pairs discordant."""
    return abs(delta) <= disc + 1e-12


@dataclass(frozen=True)
class Simulated:
    """Verdict shares and mean items over ``studies`` simulated suites."""

    non_inferior: float
    worse: float
    inconclusive: float
    expected_n: float
    expected_n_se: float
    studies: int
    verdicts: np.ndarray | None = field(default=None, repr=False, compare=False)  # per study; None: undecided

    def se(self, p: float) -> float:
        """Monte Carlo standard error of a share whose true value is p."""
        return float(np.sqrt(max(p * (1 - p), 1e-12) / self.studies))


def simulate_operating(p: seq.Plan, n: int, disc: float, delta: float, margin: float = MARGIN, *,
                       studies: int = 10_000, rng=None) -> Simulated:
    """The plan run on simulated suites: each look adds its items' (win, loss, tie) draws."""
    rng = np.random.default_rng(rng)
    p_win, p_loss = (disc + delta) / 2, (disc - delta) / 2
    sizes = p.look_sizes(n)
    counts = np.zeros((studies, 2), dtype=np.int64)
    verdict = np.full(studies, None, dtype=object)
    used = np.full(studies, sizes[-1], dtype=float)
    prev = 0
    for k, nk in enumerate(sizes):
        counts += rng.multinomial(nk - prev, [p_win, p_loss, 1 - p_win - p_loss], size=studies)[:, :2]
        z_ni, z_loss = seq.binary_z(counts[:, 0], counts[:, 1], nk, margin)
        for i in np.flatnonzero(verdict == None):  # noqa: E711 (object array)
            v = seq.decide(p, k, float(z_ni[i]), float(z_loss[i]))
            if v is not None:
                verdict[i], used[i] = v, nk
        prev = nk
    return Simulated(float(np.mean(verdict == "non-inferior")), float(np.mean(verdict == "worse")),
                     float(np.mean(verdict == None)), float(used.mean()),  # noqa: E711
                     float(used.std(ddof=1) / np.sqrt(studies)), studies, verdict)


def _exact(design: str, n: int, disc: float, delta: float) -> seq.Operating | None:
    return seq.exact_operating(plan(design), n, disc, delta, MARGIN) if feasible(disc, delta) else None


def grid(designs=DESIGNS, ns=NS, discs=DISCS) -> dict:
    """{(design, n, disc, delta): Operating or None} at delta = -margin, 0, -2 margin."""
    return {(d, n, c, delta): _exact(d, n, c, delta)
            for d in designs for n in ns for c in discs for delta in (-MARGIN, 0.0, -2 * MARGIN)}


def summary(g: dict, ns=NS, discs=DISCS) -> str:
    """What the figures of :func:`grid` say, in one paragraph (every number computed here)."""
    m, cells = -MARGIN, [(n, c) for n in ns for c in discs]

    def get(d, n, c, delta, attr):
        return getattr(g[(d, n, c, delta)], attr)

    def worst(d, delta, attr):
        return max(get(d, n, c, delta, attr) for n, c in cells)

    naive_over = sum(get("naive", n, c, m, "non_inferior") > ALPHA for n, c in cells)
    naive_loss = sum(get("naive", n, c, 0.0, "worse") > LOSS_ALPHA for n, c in cells)
    drop = {d: {(n, c): get("fixed", n, c, 0.0, "non_inferior") - get(d, n, c, 0.0, "non_inferior")
                for n, c in cells} for d in ("obrien-fleming", "pocock")}
    at = {d: max(drop[d], key=drop[d].get) for d in drop}
    big = {d: max([v for (n, _), v in drop[d].items() if n >= 120] or [float("nan")]) for d in drop}
    en = {d: [get(d, n, c, 0.0, "expected_n") / n for n, c in cells] for d in drop}
    worse_n = [get("obrien-fleming", n, c, 2 * m, "expected_n") / n for n, c in cells if feasible(c, 2 * m)]
    worse_drop = {d: max(get("fixed", n, c, 2 * m, "worse") - get(d, n, c, 2 * m, "worse")
                         for n, c in cells if feasible(c, 2 * m)) for d in drop}
    return (
        f"What they say: on this grid the fixed design and both spending plans hold both levels: the largest "
        f"type I error of \"non-inferior\" is {worst('fixed', m, 'non_inferior'):.4f} (fixed), "
        f"{worst('obrien-fleming', m, 'non_inferior'):.4f} (OBF), {worst('pocock', m, 'non_inferior'):.4f} "
        f"(Pocock), and of \"worse\" {worst('fixed', 0.0, 'worse'):.4f}, "
        f"{worst('obrien-fleming', 0.0, 'worse'):.4f}, {worst('pocock', 0.0, 'worse'):.4f} (nominal "
        f"{LOSS_ALPHA:.4f}). The discrete counts move individual cells either way, so OBF is sometimes a "
        f"little above the fixed design, nowhere above the level. The naive plan exceeds 0.05 in {naive_over} of "
        f"{len(cells)} cells (up to {worst('naive', m, 'non_inferior'):.4f}) and its loss test exceeds "
        f"{LOSS_ALPHA:.4f} in {naive_loss} (up to {worst('naive', 0.0, 'worse'):.4f}): testing three times at "
        f"the fixed z is what the spending prevents. OBF costs little power: at most "
        f"{drop['obrien-fleming'][at['obrien-fleming']]:.3f} against the fixed design (n = "
        f"{at['obrien-fleming'][0]}, disc {at['obrien-fleming'][1]:.1f}), at most {big['obrien-fleming']:.3f} "
        f"from n = 120 on; Pocock up to {drop['pocock'][at['pocock']]:.3f} (n = {at['pocock'][0]}, disc "
        f"{at['pocock'][1]:.1f}), {big['pocock']:.3f} from n = 120 on. The saving is in items: an unchanged "
        f"candidate runs {min(en['obrien-fleming']):.2f}-{max(en['obrien-fleming']):.2f} of n on average with "
        f"OBF ({min(en['pocock']):.2f}-{max(en['pocock']):.2f} with Pocock), a clearly worse one "
        f"{min(worse_n):.2f}-{max(worse_n):.2f} with OBF, which calls it \"worse\" at most "
        f"{max(worse_drop['obrien-fleming'], 0):.3f} less often than the fixed design (Pocock up to "
        f"{worse_drop['pocock']:.3f} less often); the saving grows with n and shrinks with the "
        "discordance, and at n = 30 (10 items a look) the early OBF boundaries are out of reach, so the plan "
        "is the fixed design in all but name."
    )


def report_lines(*, studies: int = 10_000, rng=None, grid_size: str = "full") -> list[str]:
    """The CALIBRATION.md section on the group-sequential quality gates (``grid_size`` "small":
    two sizes and two discordances, for the unit tests)."""
    rng = np.random.default_rng(rng)
    ns, discs = pick(NS, (30, 217), grid_size), pick(DISCS, (0.1, 0.3), grid_size)
    g = grid(ns=ns, discs=discs)
    return (_intro_lines(g, ns, discs) + _type_one_lines(g, ns, discs) + _power_lines(g, ns, discs)
            + _clearly_worse_lines(g, ns, discs) + _simulated_lines(studies, rng, grid_size))


def _value(g: dict, d: str, n: int, c: float, delta: float, f) -> str:
    """A cell: f of the operating characteristics at (design, n, disc, delta), '—' where none."""
    op = g[(d, n, c, delta)]
    return "—" if op is None else f(op)


def _worst(g: dict, d: str, delta: float, attr: str) -> float:
    """The largest `attr` of design d at delta over the grid's sizes and discordances."""
    return max(getattr(op, attr) for (dd, _, _, de), op in g.items() if dd == d and de == delta and op)


def _share(n: int):
    """A cell's formatter: the expected items as a share of n."""
    return lambda o: f"{o.expected_n / n:.2f}"


def _intro_lines(g: dict, ns, discs) -> list[str]:
    """The section's heading, its design (the boundaries of each plan) and the summary."""
    obf, poc = plan("obrien-fleming"), plan("pocock")
    fmt_b = lambda b: ", ".join(f"{x:.3f}" for x in b)  # noqa: E731
    out = [
        "",
        "## Group-sequential quality gates (analysis/sequential.py)",
        "",
        f"A suite's items in a fixed shuffled order, the quality tests run at {LOOKS} equally spaced looks "
        f"(a third, two thirds, all); non-inferiority (margin {MARGIN:.2f}) at alpha = {ALPHA} and a loss at "
        f"{ALPHA}/{SUITES}, each with Lan-DeMets alpha spending. Boundaries on the z scale: O'Brien-Fleming "
        f"(OBF) non-inferiority ({fmt_b(obf.ni_bounds)}), loss ({fmt_b(obf.loss_bounds)}); Pocock "
        f"({fmt_b(poc.ni_bounds)}), ({fmt_b(poc.loss_bounds)}); the fixed design tests once at "
        f"{plan('fixed').ni_bounds[0]:.3f} and {plan('fixed').loss_bounds[0]:.3f}. `naive` tests at the "
        "fixed design's boundaries at every look (no spending): the test of the test, which should not "
        "hold the level. Every figure is exact: the distribution of (wins, losses) of trinomial pass/fail "
        "pairs is propagated from look to look (convolution with the next look's items, the stopped "
        "tables removed), with the gate's statistics (Tango's score z, continuity correction 1/2). "
        "`disc` = P(pair discordant); delta = P(win) - P(loss); '—' where the discordance cannot hold "
        "the change (|delta| > disc).",
        "",
        summary(g, ns, discs),
        "",
    ]
    return out


def _type_one_lines(g: dict, ns, discs) -> list[str]:
    """Type I error: P("non-inferior") at the margin and P("worse") when nothing changed."""
    m = -MARGIN
    out = [
        "### Type I error",
        "",
        "P(\"non-inferior\") at the margin (delta = -margin; nominal <= 0.05) and P(\"worse\") when "
        f"nothing changed (delta = 0; nominal <= {LOSS_ALPHA:.4f}).",
        "",
        "| n | disc | non-inferior: fixed | OBF | Pocock | naive | worse: fixed | OBF | Pocock | naive |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in ns:
        for c in discs:
            cells = [_value(g, d, n, c, m, lambda o: f"{o.non_inferior:.4f}") for d in DESIGNS]
            cells += [_value(g, d, n, c, 0.0, lambda o: f"{o.worse:.4f}") for d in DESIGNS]
            out.append(f"| {n} | {c:.1f} | " + " | ".join(cells) + " |")
    out.append("| **max** | | " + " | ".join(
        [f"**{_worst(g, d, m, 'non_inferior'):.4f}**" for d in DESIGNS]
        + [f"**{_worst(g, d, 0.0, 'worse'):.4f}**" for d in DESIGNS]) + " |")
    return out


def _power_lines(g: dict, ns, discs) -> list[str]:
    """Power of an unchanged candidate and the expected items run."""
    m = -MARGIN
    out = [
        "",
        "### Power and expected items",
        "",
        "P(\"non-inferior\") of an unchanged candidate (delta = 0), and the expected number of items run "
        "as a share of n, for an unchanged candidate and for one exactly at the margin. The fixed design "
        "always runs n.",
        "",
        "| n | disc | power: fixed | OBF | Pocock | E[n]/n at 0: OBF | Pocock | at -margin: OBF | Pocock |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in ns:
        for c in discs:
            cells = [_value(g, d, n, c, 0.0, lambda o: f"{o.non_inferior:.3f}") for d in DESIGNS[:3]]
            for delta in (0.0, m):
                cells += [_value(g, d, n, c, delta, _share(n)) for d in DESIGNS[1:3]]
            out.append(f"| {n} | {c:.1f} | " + " | ".join(cells) + " |")
    return out


def _clearly_worse_lines(g: dict, ns, discs) -> list[str]:
    """A candidate two margins worse: P("worse"), expected items and stopping at the first look."""
    m2 = -2 * MARGIN
    out = [
        "",
        "### A clearly worse candidate (delta = -2 margin)",
        "",
        "P(\"worse\"), the expected items as a share of n, and P(stopping at the first look).",
        "",
        "| n | disc | worse: fixed | OBF | Pocock | E[n]/n: OBF | Pocock | stop at look 1: OBF | Pocock |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in ns:
        for c in discs:
            if not feasible(c, m2):
                continue
            cells = [_value(g, d, n, c, m2, lambda o: f"{o.worse:.3f}") for d in DESIGNS[:3]]
            cells += [_value(g, d, n, c, m2, _share(n)) for d in DESIGNS[1:3]]
            cells += [_value(g, d, n, c, m2, lambda o: f"{o.stop_at[0]:.3f}") for d in DESIGNS[1:3]]
            out.append(f"| {n} | {c:.1f} | " + " | ".join(cells) + " |")
    return out


def _simulated_lines(studies: int, rng, grid_size: str) -> list[str]:
    """The exact figures checked against simulated suites."""
    m, m2 = -MARGIN, -2 * MARGIN
    out = [
        "",
        "### Simulated cross-check",
        "",
        f"{studies:,} simulated suites per row (trinomial draws per look, cumulative counts, the gate's "
        "z statistics and decision rule); exact / simulated ± 1.96 MC SE.",
        "",
        "| plan | n | disc | delta | P(non-inferior) | P(worse) | E[n]/n |",
        "|---|---|---|---|---|---|---|",
    ]
    checks = (("obrien-fleming", 217, 0.3, m), ("obrien-fleming", 217, 0.3, 0.0),
              ("obrien-fleming", 120, 0.5, m2), ("pocock", 217, 0.5, m), ("naive", 217, 0.5, m))
    for d, n, c, delta in pick(checks, checks[:1], grid_size):
        ex, sim = _exact(d, n, c, delta), simulate_operating(plan(d), n, c, delta, studies=studies, rng=rng)
        out.append(
            f"| {LABELS[d]} | {n} | {c:.1f} | {delta:+.2f} | {ex.non_inferior:.4f} / {sim.non_inferior:.4f} ± "
            f"{1.96 * sim.se(ex.non_inferior):.4f} | {ex.worse:.4f} / {sim.worse:.4f} ± {1.96 * sim.se(ex.worse):.4f} "
            f"| {ex.expected_n / n:.3f} / {sim.expected_n / n:.3f} ± {1.96 * sim.expected_n_se / n:.3f} |")
    return out
