"""What a gate says: one result per check, and the decision over them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str         # "pass", "fail", or "warn" (does not fail the run)
    detail: str


@dataclass(frozen=True)
class Decision:
    passed: bool
    results: tuple[GateResult, ...]

    @property
    def failures(self) -> list[GateResult]:
        return [r for r in self.results if r.status == "fail"]


def inconclusive_status(gates) -> str:
    """A check that could not decide: "fail" unless the config says `inconclusive = "warn"`."""
    return "fail" if gates.inconclusive == "fail" else "warn"


def failed(c: dict | None, level: float) -> bool:
    """A check (or control) that shows a deviation: a token of probability 0, or p below level."""
    return c is not None and bool(c.get("impossible") or (c.get("pvalue") is not None and c["pvalue"] < level))


def evidence(c: dict, level: float) -> str:
    if c.get("impossible"):
        return f"{c['impossible']} of {c.get('n', 0)} token(s) have probability 0 under it (p = 0)"
    return f"p={c['pvalue']:.3g} < {level:.3g} over {c.get('n', 0)} tokens"


def needed(c: dict) -> str:
    """What would decide a check too small to detect any distortion (analysis.pit.tokens_needed,
    analysis.exactness.samples_needed), in words; "" when it was not worked out."""
    n, what = (c.get("tokens_needed"), "tokens") if c.get("tokens_needed") else (c.get("samples_needed"), "samples")
    return f"about {n} {what} like these would detect a TV of 0.1 with 80% power" if n else ""
