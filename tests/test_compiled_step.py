"""`compile=True` (torch.compile of the one-token decode step) gives the eager path's tokens, on
tiny Llama and Qwen2 models: `standard` greedy and sampled, and `speculative` whose draft model
steps are compiled (rejections and rollbacks included). The compile itself takes a minute or
more on a busy CPU, once per model; inductor's cache goes to this test's own folder."""
from __future__ import annotations

import pytest
import torch

from decoders import GenerationRequest
from decoders.speculative import SpeculativeDecoder
from decoders.standard import StandardDecoder
from harness.models import build_tiny

SAMPLED = dict(temperature=0.9, top_p=0.9, seed=3)


@pytest.fixture(scope="module", autouse=True)
def own_inductor_cache(tmp_path_factory):
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    yield
    mp.undo()
    torch.set_num_threads(saved)


@pytest.mark.slow
@pytest.mark.parametrize("family", ("llama", "qwen2"))
def test_compiled_step_gives_the_eager_tokens(family):
    target, unrelated = build_tiny(family), build_tiny(family, seed=1)
    prompt = tuple(target.encode("The cat sat on the mat. The cat sat on the", chat=False))
    for sampling in ({}, SAMPLED):
        r = GenerationRequest(prompt, max_new_tokens=20, stop_token_ids=(), **sampling)
        eager = StandardDecoder(target).generate(r)
        compiled = StandardDecoder(target, compile=True)
        for _ in range(2):  # the second request reuses the compiled step and the cache buffers
            res = compiled.generate(r)
            assert res.tokens == eager.tokens and len(res.tokens) == 20
    r = GenerationRequest(prompt, max_new_tokens=20, stop_token_ids=(), **SAMPLED)
    for verify in ("coupled", "rejection"):
        eager = SpeculativeDecoder(target, draft=unrelated, k=3, verify=verify).generate(r)
        res = SpeculativeDecoder(target, draft=unrelated, k=3, verify=verify, compile=True).generate(r)
        assert res.tokens == eager.tokens
        assert res.stats["accepted_per_round"] == eager.stats["accepted_per_round"]
        assert res.stats["accepted"] < res.stats["proposed"]  # rollbacks after rejections happened
