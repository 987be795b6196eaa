"""The in-process reference of the engine exactness check (harness/run/engine_exactness.py):
teacher-forcing every sample of a prompt in one call must give the rows that teacher-forcing each
sample alone gives, and must compute each prompt once."""
from __future__ import annotations

import types

import torch

from harness.run import engine_exactness
from harness.run.engine_exactness import Reference, Seqs


def _reference(loaded) -> Reference:
    config = types.SimpleNamespace(profile=types.SimpleNamespace(exactness_reference="target"))
    return Reference(config, types.SimpleNamespace(baseline_target=loaded), None)


def _seqs(rows) -> Seqs:
    seqs = Seqs.__new__(Seqs)
    seqs.rows = rows
    return seqs


def test_prefetched_rows_match_one_sample_at_a_time(tiny_llama, monkeypatch):
    request = lambda prompt: types.SimpleNamespace(prompt_ids=prompt, temperature=0.7, top_p=0.8, top_k=0)
    a, b = [5, 9, 13, 21, 34, 55], [7, 3, 11]
    outs = [(a, [1, 2, 3, 4]), (a, [4, 3, 2, 1]), (a, [8, 8]), (b, [2, 4, 6, 8]), (a, [1, 2, 3, 4]), (b, [9])]
    rows = [({"tokens": t}, request(p)) for p, t in outs]

    calls = []
    real = engine_exactness.teacher_forced_logits
    monkeypatch.setattr(engine_exactness, "teacher_forced_logits",
                        lambda loaded, ctx, seqs: calls.append((tuple(ctx), len(seqs))) or real(loaded, ctx, seqs))
    batched = _reference(tiny_llama)
    batched.prefetch([_seqs(rows[:3]), _seqs(rows[3:])])
    # one call per prompt, each distinct sample once (the repeated one is not computed again)
    assert sorted(calls) == sorted([(tuple(a), 3), (tuple(b), 2)])

    alone = _reference(tiny_llama)
    calls.clear()
    for r, req in rows:
        got = batched.rows(req.prompt_ids, r["tokens"], req)
        want = alone.rows(req.prompt_ids, r["tokens"], req)
        assert len(got) == len(want) == len(r["tokens"])
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            if g is not None:
                # float64 probabilities from fp32 logits of a batched and a single forward
                torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.as_tensor(batched.margins(req.prompt_ids, r["tokens"])),
                                   torch.as_tensor(alone.margins(req.prompt_ids, r["tokens"])), rtol=0, atol=1e-4)
    assert len(calls) == 5  # the one-at-a-time side computed each distinct sample by itself
