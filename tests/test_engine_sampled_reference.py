"""Sampled traffic through engines (issue 22), continued: with `exactness_reference =
"engine:plain"` (llama.cpp's own top-20 logprobs over each output instead of the in-process copy)
the correct candidate passes and the Q2_K and top-p ones fail; a baseline that ignores the
request's seed fails. Real llama.cpp servers; the helpers are `tests/test_engine_sampled.py`'s."""
from __future__ import annotations

import pytest

from tests.test_engine_sampled import _gate, _run

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("llama_server")]


def test_the_engines_own_logprobs_as_the_reference(tmp_path):
    cands = "".join(f'[[candidates]]\nname = "{n}"\ndecoder = "llama.cpp"\nkind = "exact"\noptions = {{ {o} }}\n\n'
                    for n, o in [("plain2", 'engine = "plain2"'), ("q2k", 'engine = "q2k"'),
                                 ("wide", 'engine = "plain", extra = { top_p = 1.0 }')])
    code, summary, _ = _run(tmp_path, reference="engine:plain", max_new_tokens=32, candidates=cands,
                            suites=("longform",))
    pit = summary["candidates"]["plain2"]["exactness"]["pit"]
    assert pit["reference_kind"] == "engine:plain" and "top-20 raw logprobs" in pit["reference"]
    assert _gate(summary, "plain2", "exactness control")["status"] == "pass"
    assert _gate(summary, "plain2", "exactness PIT all")["status"] == "pass"
    assert pit["subsets"]["all"]["left_out"] > 0  # positions whose nucleus the top-20 cannot decide, counted
    for bad in ("q2k", "wide"):
        assert _gate(summary, bad, "exactness PIT all")["status"] == "fail", bad
    assert code == 1


def test_a_seed_the_engine_ignores_fails_closed(tmp_path):
    """A baseline that ignores the seed repeats every pair. Here (8 prompts x 24 tokens, top-p
    0.95) the reference leaves most positions out and the repeats' chance bound is only about 0.07;
    a run with the engine's own logprobs at 48 tokens measured chance 9e-8 but noise 0.48 logits a
    token, which the per-prompt rule adds to every token (Fisher p 0.11). So the seed cannot be named
    as ignored at this size: the gate must fail as inconclusive, naming the repeats, never pass."""
    only = '[[candidates]]\nname = "plain2"\ndecoder = "llama.cpp"\nkind = "exact"\noptions = { engine = "plain2" }\n'
    code, summary, _ = _run(tmp_path, baseline_extra=", extra = { seed = 7 }", candidates=only, max_new_tokens=24,
                            suites=("longform",), top_p=0.95)
    seed = _gate(summary, "plain2", "seed")
    assert seed["status"] == "fail", seed
    assert ("ignores the request's seed" in seed["detail"]
            or ("inconclusive" in seed["detail"] and "identical on all 8 pair(s)" in seed["detail"])), seed
    assert code == 1
