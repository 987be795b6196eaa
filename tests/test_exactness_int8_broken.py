"""The rejection verifier with the int8 draft at the shipped smoke settings, broken: drawing the
correction from p instead of the residual fails its exactness checks, while the controls (which
do not rest on the verifier) still pass. The correct verifier: `tests/test_exactness_int8.py`,
whose config this shares; this run makes its own baseline, so the two files run in parallel."""
from __future__ import annotations

import pytest

import decoders.speculative as spec
from tests.test_exactness_gates import resample_from_p
from tests.test_exactness_int8 import config, regress  # noqa: F401 (config is a fixture)

pytestmark = pytest.mark.slow


def test_a_correction_drawn_from_p_still_fails(config, tmp_path, monkeypatch):
    monkeypatch.setattr(spec, "verify_rejection", resample_from_p)
    code, cand = regress(config, tmp_path / "run")
    caught = [g for g in cand["gates"] if g["status"] == "fail" and g["name"].startswith("exactness")
              and "control" not in g["name"]]
    assert code == 1 and caught, cand["gates"]
    assert all(g["status"] == "pass" for g in cand["gates"] if "control" in g["name"])
