"""The rejection verifier with the dynamically quantized sibling as its draft (smollm2-135m-int8),
at the shipped smoke settings (longform smoke, T = 0.7, top-p 0.95, seeds 0 and 1, K = 4) but for
the goodness-of-fit window's sample count: correct, it passes its exactness checks; drawing the
correction from p instead of the residual, it fails them.

The window takes SAMPLES draws instead of the shipped 200. Each draw is a whole speculative
request (a prefill of the window's context by both models) plus its reference and replayed q, so
at 200 the window was 3/4 of the run: 12 min a run on a 2-core AMD EPYC without AVX-512. The
sampled records alone reject ~160 drafts, and the broken verifier put 41 of 351 rejected
positions at probability 0 there, so the PIT over rejected positions decides either way with
room to spare at 60.

Why this needs the real models: dynamic int8 quantization computes activation scales from the
tokens in each forward, so the draft's q depends on how the draft was fed while decoding. A q
rebuilt by one batched forward is another distribution (the check then saw corrections of
probability 0 under the residual and failed a correct decoder); the replay in
`harness/run/reference.py` gives back the q it sampled from. Only the sampled temperature of the
smoke profile runs: greedy identity is not what is tested here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import decoders.speculative as spec
import helpers
from helpers import SHIPPED, shipped_smoke, write_regress_config
from tests.test_exactness_gates import _baseline_only, resample_from_p

pytestmark = pytest.mark.slow
SAMPLES = 60


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    assert 0.7 in SHIPPED["profiles"]["smoke"]["temperatures"]
    assert "longform" in SHIPPED["profiles"]["smoke"]["sample_suites"]
    return write_regress_config(tmp_path_factory.mktemp("int8") / "regress.toml", target="smollm2-135m",
                                head={"top_p": SHIPPED["top_p"]}, candidates="""
[[candidates]]
name = "spec-int8-rejection"
decoder = "speculative"
options = { draft = "smollm2-135m-int8", k = 4, verify = "rejection" }
""", suites={"longform": {}}, gates=SHIPPED["gates"],
                                profile={"suites": ["longform"], "sample_suites": ["longform"], "temperatures": [0.7],
                                         "exactness_samples": SAMPLES,
                                         **shipped_smoke("subset", "seeds", "max_new_tokens", "exactness_prompts")})


def regress(cfg: Path, run_dir: Path) -> tuple[int, dict]:
    code = helpers.regress(cfg, run_dir)
    return code, helpers.summary(run_dir)["candidates"]["spec-int8-rejection"]


@pytest.fixture(scope="module")
def clean(config, tmp_path_factory):
    run = tmp_path_factory.mktemp("clean") / "run"
    return run, regress(config, run)


def test_the_correct_verifier_with_the_int8_draft_passes(clean):
    _, (code, cand) = clean
    exactness = [g for g in cand["gates"] if g["name"].startswith("exactness")]
    assert code == 0 and cand["verdict"] == "pass", [g for g in exactness if g["status"] != "pass"]
    pit = cand["exactness"]["pit"]
    assert pit["subsets"]["rejected"]["n"] >= 100 and pit["subsets"]["rejected"]["impossible"] == 0
    # the draft-side control: the replayed q explains every proposal
    assert pit["draft_control"]["impossible"] == 0 and pit["draft_control"]["pvalue"] > pit["level"]
    assert {"exactness control", "exactness draft control"} <= {g["name"] for g in exactness if g["status"] == "pass"}


def test_a_correction_drawn_from_p_still_fails(config, clean, tmp_path, monkeypatch):
    _baseline_only(clean[0], tmp_path / "run")
    monkeypatch.setattr(spec, "verify_rejection", resample_from_p)
    code, cand = regress(config, tmp_path / "run")
    caught = [g for g in cand["gates"] if g["status"] == "fail" and g["name"].startswith("exactness")
              and "control" not in g["name"]]
    assert code == 1 and caught, cand["gates"]
    assert all(g["status"] == "pass" for g in cand["gates"] if "control" in g["name"])
