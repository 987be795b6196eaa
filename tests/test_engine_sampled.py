"""Sampled traffic through engines (issue 22), against real llama.cpp servers started here.

One `regress` run at T = 0.7, three seeds, on the shipped longform smoke items (the factual ones
are short and mostly near-certain: they cost time and add few informative tokens), at top-p 0.8
rather than the shipped 0.95: a dropped or widened nucleus then shows as tokens of probability 0
at many positions instead of a few per thousand, so the broken candidates fail on any processor's
draws, not only on this one's. The baseline is llama.cpp with speculation off; the candidates, all
declared exact:
- `plain2`: a second server with the same flags (correct: must pass);
- `ngram`: llama.cpp's n-gram speculation (reported: whatever the test says, with its power);
- `q2k`: the Q2_K requantization served as if exact (must fail);
- `hot`: the baseline's server, its requests overriding the temperature (1.5 sent where 0.7
  was asked, through `extra`: the "drafter ignores temperature" class; must fail). A mild
  override (0.9) flattens a confident position too little to put a token outside the T = 0.7
  nucleus; its only trace is a PIT deviation of ~0.004, below what the test can resolve where two
  thirds of the positions are left out (on an AMD EPYC without AVX-512 the Q4_1 kernels sit up to
  0.89 logits from the fp32 copy, and 0.9 passed there). At 1.5 a position whose T = 0.7 nucleus is
  one token at p ~0.95 has a second token of p ~0.2, so tokens of probability 0 appear on any
  processor;
- `wide`: the baseline's server with top-p dropped (1.0 sent; must fail);
- `deaf`: the baseline's server with the request's seed overridden (7 sent whatever seed was
  asked): one draw per prompt, repeated at every seed. Token by token those draws follow the
  target, so the PIT passes them; only the candidate's own seed check fails it.
Each is judged by the sequential PIT test against the reference, with the baseline's own samples
as the control. The engine's own logprobs as the reference, and a seed the engine ignores:
`tests/test_engine_sampled_reference.py` (a file of its own, so that xdist runs it beside this one).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.run.engines import gguf
from tests.test_engines import launch_args

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("llama_server")]


def _config(tmp_path: Path, reference: str = "target", top_p: float = 0.8, baseline_extra: str = "",
            candidates: str | None = None, max_new_tokens: int = 48, seeds: tuple = (0, 1),
            suites: tuple = ("factual", "longform")) -> Path:
    plain = launch_args("-np", "1", "--spec-type", "none")
    q2k = [a if a != gguf("smollm2-135m") else gguf("smollm2-135m-q2k") for a in plain]
    ngram = launch_args("-np", "1", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                        "--spec-ngram-simple-size-m", "8")
    engines = {"plain": plain, "plain2": plain, "q2k": q2k, "ngram": ngram}
    tables = "".join(f"[engines.{n}]\nlaunch = {json.dumps(a)}\nmodel = \"smollm2-135m\"\n\n"
                     for n, a in engines.items())
    if candidates is None:
        candidates = "".join(
            f'[[candidates]]\nname = "{n}"\ndecoder = "llama.cpp"\nkind = "exact"\noptions = {{ {o} }}\n\n'
            for n, o in [("plain2", 'engine = "plain2"'), ("ngram", 'engine = "ngram"'), ("q2k", 'engine = "q2k"'),
                         ("hot", 'engine = "plain", extra = { temperature = 1.5 }'),
                         ("wide", 'engine = "plain", extra = { top_p = 1.0 }'),
                         ("deaf", 'engine = "plain", extra = { seed = 7 }')])
    cfg = tmp_path / "sampled.toml"
    cfg.write_text(f"""target = "smollm2-135m"
top_p = {top_p}
{tables}
[baseline]
name = "base"
decoder = "llama.cpp"
options = {{ engine = "plain"{baseline_extra} }}

{candidates}
[suites.factual]
path = "{ROOT / 'suites/data/factual.jsonl'}"
[suites.longform]
path = "{ROOT / 'suites/data/longform.jsonl'}"

[profiles.smoke]
subset = "smoke"
suites = {json.dumps(list(suites))}
temperatures = [0.7]
seeds = {json.dumps(list(seeds))}
max_new_tokens = {max_new_tokens}
exactness_reference = "{reference}"

[gates]
inconclusive = "fail"
""")
    return cfg


def _run(tmp_path: Path, **kw) -> tuple[int, dict, str]:
    run_dir = tmp_path / "run"
    code = main(["regress", "--config", str(_config(tmp_path, **kw)), "--run-dir", str(run_dir), "--no-tracking",
                 "--no-progress", "--baseline-store", str(tmp_path / "store")])
    return code, json.loads((run_dir / "summary.json").read_text()), (run_dir / "report.txt").read_text()


def _gate(summary: dict, cand: str, name: str):
    found = [g for g in summary["candidates"][cand]["gates"] if g["name"] == name]
    assert found, (cand, name, [g["name"] for g in summary["candidates"][cand]["gates"]])
    return found[0]


@pytest.fixture(scope="module")
def target_run(tmp_path_factory):
    # Three seeds, for `wide`: a dropped top-p shows as tokens outside the nucleus at ~2% of the
    # tested positions (7 of 336 on an AMD EPYC without AVX-512); two seeds' worth would leave
    # about a 1% chance of seeing none.
    return _run(tmp_path_factory.mktemp("sampled-target"), seeds=(0, 1, 2), suites=("longform",), max_new_tokens=40)


def test_the_baseline_passes_its_own_control_against_the_target(target_run):
    _, summary, _ = target_run
    ctrl = _gate(summary, "plain2", "exactness control")
    assert ctrl["status"] == "pass", ctrl
    pit = summary["candidates"]["plain2"]["exactness"]["pit"]
    # Q4_1 kernels against the dequantized fp32 copy: margins apart by up to ~0.6 logits, so the
    # positions whose nucleus that noise could move are left out (about two thirds here).
    assert pit["noise"]["max"] is not None and pit["noise"]["max"] > 0
    assert pit["control"]["n"] >= 200 and pit["control"]["left_out"] > 0


def test_broken_candidates_fail_while_correct_ones_pass(target_run):
    code, summary, report = target_run
    assert code == 1
    assert _gate(summary, "plain2", "exactness PIT all")["status"] == "pass"
    for bad in ("q2k", "hot", "wide"):
        res = _gate(summary, bad, "exactness PIT all")
        assert res["status"] == "fail" and "not the target's distribution" in res["detail"], (bad, res)
        assert summary["candidates"][bad]["verdict"] == "fail"
    # Dropping top-p draws tokens the nucleus excludes: outright evidence, not only a p-value.
    assert summary["candidates"]["wide"]["exactness"]["pit"]["subsets"]["all"]["impossible"] > 0
    assert "exactness plain2 coverage:" in report and "detects a top-two distortion" in report


def test_ngram_speculation_is_reported_with_its_power(target_run):
    _, summary, report = target_run
    res = summary["candidates"]["ngram"]["exactness"]["pit"]["subsets"]["all"]
    assert res["pvalue"] is not None and res["n"] >= 200 and res["proposed"] > 0
    assert res["detectable_tv"] is not None and 0 < res["detectable_tv"] < 0.5
    assert "acceptance ngram T=0.7" in report


def test_a_candidate_that_ignores_the_seed_fails(target_run):
    """`deaf` repeats one sample per prompt at all three seeds. Each of its tokens is a fair draw
    from the target, so the PIT fits; it passed (exit 0 alone beside a correct candidate) because
    only the baseline's seed was checked."""
    _, summary, _ = target_run
    seed = _gate(summary, "deaf", "candidate seed")
    assert seed["status"] == "fail" and "the candidate deaf ignores the request's seed" in seed["detail"], seed
    assert "identical on all 16 pair(s)" in seed["detail"]
    assert summary["candidates"]["deaf"]["verdict"] == "fail"
    assert not [g for g in summary["candidates"]["plain2"]["gates"] if g["name"] == "candidate seed"]
