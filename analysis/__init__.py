"""decodegate analysis: pure functions over generation records.

Pair baseline and candidate records (:mod:`.pairing`), then: token identity and divergence
forensics (:mod:`.identity`), paired quality tests (:mod:`.paired`, :mod:`.quality`; group-sequential looks, :mod:`.sequential`),
distribution exactness (:mod:`.exactness`; the sequential PIT test, :mod:`.pit`), speculative
acceptance (:mod:`.acceptance`), early-exit statistics (:mod:`.exits`), latency (:mod:`.latency`) and report figures
(:mod:`.figures`, imported on demand because it loads matplotlib). Calibration of the tests:
``python -m harness.calibration.report`` (results in ``harness/calibration/CALIBRATION.md``).
"""

from .acceptance import (
    AcceptanceSummary, acceptance_by_group, acceptance_summary, expected_round_tokens, expected_tokens_per_round,
    round_speedup, theoretical_speedup,
)
from .exactness import (
    GoodnessOfFitResult, HomogeneityResult, InsufficientDataError, goodness_of_fit, homogeneity,
)
from .pit import PitFeatures, PitTestResult, pit_test
from .exits import ExitSummary, exit_by_group, exit_summary, exit_theoretical_speedup
from .identity import DEFAULT_EPS, Divergence, IdentityResult, common_prefix_length, token_identity
from .latency import LatencySummary, Percentiles, SpeedupResult, latency_summary, paired_speedup
from .paired import (
    DifferenceResult, HolmResult, McNemarResult, NonInferiorityResult, WilcoxonResult, holm, mcnemar,
    non_inferiority, paired_proportion_difference, tango_interval, wilcoxon_signed_rank,
)
from .pairing import Pair, PairingError, PairKey, pair_records, split_by_candidate
from .quality import QualityDelta, quality_delta, quality_deltas
from ._common import ConfidenceInterval

__all__ = [
    "AcceptanceSummary", "ConfidenceInterval", "DEFAULT_EPS", "DifferenceResult", "Divergence",
    "ExitSummary", "GoodnessOfFitResult", "HolmResult", "HomogeneityResult", "IdentityResult",
    "InsufficientDataError", "LatencySummary", "McNemarResult", "NonInferiorityResult", "Pair",
    "PairKey", "PairingError", "Percentiles", "QualityDelta", "SpeedupResult", "WilcoxonResult",
    "acceptance_by_group", "acceptance_summary", "common_prefix_length", "exit_by_group",
    "exit_summary", "exit_theoretical_speedup", "expected_round_tokens", "expected_tokens_per_round", "goodness_of_fit",
    "holm", "homogeneity", "latency_summary", "mcnemar", "non_inferiority", "pair_records",
    "paired_proportion_difference", "paired_speedup", "quality_delta", "quality_deltas", "round_speedup",
    "split_by_candidate", "tango_interval", "theoretical_speedup", "token_identity",
    "wilcoxon_signed_rank", "PitFeatures", "PitTestResult", "pit_test",
]
