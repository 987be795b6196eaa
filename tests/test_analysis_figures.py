"""Figures are written to files and the functions return the paths."""

import numpy as np
import pytest

from analysis import acceptance_summary, exit_summary, pair_records, quality_deltas
from analysis import figures
from harness.calibration.synthetic import make_record, speculative_stats


def nonempty(path, suffix=".png"):
    assert path.exists() and path.stat().st_size > 1000 and path.suffix == suffix
    return True


def test_acceptance_and_exit_figures(tmp_path):
    base = [make_record(item_id=f"i{i}", tokens=list(range(12))) for i in range(3)]
    cand = [make_record(candidate="s", item_id=f"i{i}", tokens=list(range(12)), wall_s=0.3,
                        stats=speculative_stats([4, 1, 2, 0], k=4, draft_time_s=0.02, verify_time_s=0.2))
            for i in range(3)]
    summary = acceptance_summary(pair_records(base, cand), rng=0, n_resamples=100)
    assert nonempty(figures.acceptance_histogram(summary, tmp_path / "acc.png"))
    assert nonempty(figures.acceptance_by_position(summary, tmp_path / "sub" / "pos.png"))
    assert nonempty(figures.acceptance_histogram([3, 1, 0, 5], tmp_path / "raw.svg"), ".svg")
    ee = [make_record(tokens=[1, 2, 3], stats={"exit_layers": [3, 10, 12], "num_layers": 12})]
    assert nonempty(figures.exit_layer_histogram(exit_summary(ee), tmp_path / "exit.png"))
    with pytest.raises(ValueError):
        figures.acceptance_by_position([], tmp_path / "x.png")


def test_latency_and_forest(tmp_path):
    rng = np.random.default_rng(0)
    path = figures.latency_cdfs({"baseline": rng.exponential(0.06, 300), "candidate": rng.exponential(0.03, 300)},
                                tmp_path / "cdf.png", xlabel="inter-token latency (s)", log_x=True)
    assert nonempty(path)
    rows = {"factual": (-0.02, -0.06, 0.01), "code": (0.0, -0.03, 0.03)}
    assert nonempty(figures.forest_plot(rows, tmp_path / "forest.png", margin=0.05))
    base = [make_record(item_id=f"i{i}", passed=bool(i % 3)) for i in range(30)]
    cand = [make_record(candidate="c", item_id=f"i{i}", passed=bool(i % 4)) for i in range(30)]
    deltas = quality_deltas(pair_records(base, cand), margin=0.05)
    assert nonempty(figures.forest_plot(deltas, tmp_path / "forest2.pdf"), ".pdf")
