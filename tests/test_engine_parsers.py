"""Protocol parsers on payloads shaped as the engines document them (vLLM's OpenAI routes with
its extras, SGLang's /generate stream, OpenAI chat), Prometheus telemetry, and decoders of one's
own: "package.module:Class" in a config and the `decodegate.decoders` entry-point group.
vLLM's payloads as a real server sends them: tests/test_vllm_parsers.py (captures). SGLang's
here are checked on documented payloads only: no SGLang runs on this machine (docs/vllm.md)."""
from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest

from decoders.base import DecoderError, GenerationRequest, get_decoder_class
from decoders.engines import openai_compat, sglang, telemetry
from decoders.engines.client import top2_gap
from decoders.engines.llamacpp import draft_length_from_flags, parse_chunk


def test_top2_gap_is_the_logit_gap():
    logits = [2.0, 0.5, -1.0]
    z = math.log(sum(math.exp(x) for x in logits))
    assert top2_gap([x - z for x in logits]) == pytest.approx(1.5, abs=1e-12)
    assert top2_gap([-0.1]) is None and top2_gap([]) is None


def test_vllm_completion_chunk_with_token_ids_and_token_id_logprobs():
    chunk = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [{
        "index": 0, "text": " Paris", "token_ids": [12366],
        "logprobs": {"tokens": ["token_id:12366"], "token_logprobs": [-0.05],
                     "top_logprobs": [{"token_id:12366": -0.05, "token_id:9": -3.05}], "text_offset": [0]},
        "finish_reason": None}]}
    p = openai_compat.parse_completion_chunk(chunk)
    assert p.tokens == [12366] and p.text == " Paris" and p.margins == [pytest.approx(3.0)]
    # Without return_token_ids, return_tokens_as_token_ids alone still ties logprobs to ids.
    del chunk["choices"][0]["token_ids"]
    assert openai_compat.parse_completion_chunk(chunk).tokens == [12366]


def test_plain_openai_chunk_has_text_only():
    chunk = {"choices": [{"index": 0, "text": " Paris", "finish_reason": "stop",
                          "logprobs": {"tokens": [" Paris"], "top_logprobs": [{" Paris": -0.1, " Lyon": -2.1}]}}]}
    p = openai_compat.parse_completion_chunk(chunk)
    assert p.tokens == [] and p.text == " Paris" and p.finish_reason == "eos"


def test_chat_chunk():
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "length",
                          "logprobs": {"content": [{"token": "Hi", "logprob": -0.2,
                                                    "top_logprobs": [{"token": "Hi", "logprob": -0.2},
                                                                     {"token": "Hello", "logprob": -1.7}]}]}}]}
    p = openai_compat.parse_chat_chunk(chunk)
    assert p.text == "Hi" and p.tokens == [] and p.finish_reason == "length"
    chunk["choices"][0]["token_ids"] = [5]
    assert openai_compat.parse_chat_chunk(chunk).margins == [pytest.approx(1.5)]


def test_sglang_stream_is_cumulative_and_parsed_incrementally():
    state = sglang.StreamState()
    first = {"text": "The", "meta_info": {"output_token_logprobs": [[-0.1, 504, None]],
                                          "output_top_logprobs": [[[-0.1, 504, None], [-2.6, 67, None]]]}}
    second = {"text": "The cat", "meta_info": {
        "output_token_logprobs": [[-0.1, 504, None], [-0.3, 2644, None]],
        "output_top_logprobs": [[[-0.1, 504, None], [-2.6, 67, None]], [[-0.3, 2644, None], [-0.8, 9, None]]],
        "finish_reason": {"type": "length", "length": 2}, "completion_tokens": 2, "spec_verify_ct": 1,
        "prompt_tokens": 7}}
    a, b = state.parse(first), state.parse(second)
    assert a.tokens == [504] and a.margins == [pytest.approx(2.5)]
    assert b.tokens == [2644] and b.margins == [pytest.approx(0.5)] and b.finish_reason == "length"
    stats = sglang.telemetry_from_meta(b.final, k=3)
    assert stats["target_forwards"] == 1 and stats["accepted"] == 1 and stats["proposed"] == 3


def test_sglang_request_body_pins_samplers_and_sends_ids():
    from decoders import GenerationRequest
    body = sglang.generate_body(GenerationRequest((1, 2, 3), max_new_tokens=5, temperature=0.7, top_p=0.9,
                                                  seed=4, stop_strings=("\n\n",)), {"k": 3})
    assert body["input_ids"] == [1, 2, 3] and body["top_logprobs_num"] == 2 and body["return_logprob"]
    sp = body["sampling_params"]
    assert sp["sampling_seed"] == 4 and sp["top_k"] == -1 and sp["min_p"] == 0 and sp["stop"] == ["\n\n"]
    assert "k" not in body


def test_llamacpp_chunk_margins_only_where_the_target_sampled():
    sampled = {"tokens": [504], "content": "The", "stop": False,
               "completion_probabilities": [{"id": 504, "logprob": -0.8,
                                             "top_logprobs": [{"id": 504, "logprob": -0.8}, {"id": 67, "logprob": -2.7}]}]}
    drafted = {"tokens": [260], "content": " the", "stop": False}
    last = {"tokens": [], "content": "", "stop": True, "stop_type": "eos",
            "timings": {"draft_n": 8, "draft_n_accepted": 3}}
    assert parse_chunk(sampled).margins == [pytest.approx(1.9)]
    assert parse_chunk(drafted).margins == [None]
    p = parse_chunk(last)
    assert p.finish_reason == "eos" and p.final["timings"]["draft_n"] == 8
    assert draft_length_from_flags(["x", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8"]) == 8
    assert draft_length_from_flags(["x", "--spec-type", "none"]) is None


PROM_BEFORE = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
"""


def _flat(text: str) -> dict:
    return telemetry.flatten(text)


def test_prometheus_spec_counters_differenced():
    after = (PROM_BEFORE.replace("} 10.0", "} 15.0").replace("} 40.0", "} 60.0").replace("} 20.0", "} 31.0")
             .replace("} 9.0", "} 13.0").replace("} 6.0", "} 8.0"))
    delta = telemetry.spec_delta(telemetry.spec_counters(_flat(PROM_BEFORE)), telemetry.spec_counters(_flat(after)))
    stats = telemetry.stats_from_delta(delta)
    assert stats["proposed"] == 20 and stats["accepted"] == 11 and stats["rounds"] == 5
    assert stats["acceptance_by_position"] == [[4, 5], [2, 5]] and stats["k"] == 2
    assert telemetry.spec_counters(_flat("# TYPE x counter\nx_total 1\n")) is None


def test_a_requests_counters_are_waited_for_until_they_match_its_own_counts():
    """llama.cpp folds a finished request into its counters when it frees the slot, which can come
    after the last streamed chunk: the scrape right then showed nothing, and the record lost its
    per-position counts. The scrapes go on until the difference matches the request's own
    counts; one past them holds another request's and is not attributed."""
    import asyncio
    after = (PROM_BEFORE.replace("} 10.0", "} 15.0").replace("} 40.0", "} 60.0").replace("} 20.0", "} 31.0")
             .replace("} 9.0", "} 13.0").replace("} 6.0", "} 8.0"))
    before = telemetry.spec_counters(_flat(PROM_BEFORE))

    def scrapes(*texts):
        queue = [telemetry.spec_counters(_flat(t)) for t in texts]

        async def scrape():
            return queue.pop(0) if len(queue) > 1 else queue[0]
        return scrape
    own = {"proposed": 20, "accepted": 11, "telemetry": "per-request"}
    late = asyncio.run(telemetry.request_delta(scrapes(PROM_BEFORE, PROM_BEFORE, after), before, own, wait_s=0))
    assert late["acceptance_by_position"] == [[4, 5], [2, 5]] and late["proposed"] == 20
    more = after.replace("} 60.0", "} 64.0")  # another request's drafts in the difference too
    assert asyncio.run(telemetry.request_delta(scrapes(more), before, own, wait_s=0)) == {}
    never = asyncio.run(telemetry.request_delta(scrapes(PROM_BEFORE), before, own, tries=3, wait_s=0))
    assert never == {}
    # Without per-request counts to hold it to (an engine that reports none): one scrape, as it is.
    assert asyncio.run(telemetry.request_delta(scrapes(after), before, {}, wait_s=0))["proposed"] == 20


# --------------------------------------------------------------------- decoders of one's own

OWN_DECODER = textwrap.dedent('''
    """A team's own decoder, written against the documented contract only."""
    from decoders import Decoder, GenerationResult, Timing


    class Reverse(Decoder):
        name = "reverse"

        def __init__(self, target, **options):
            self.target = target
            self.flip = options.get("flip", False)

        def generate(self, request):
            ids = tuple(request.prompt_ids[-3:][::-1]) if self.flip else tuple(request.prompt_ids[-3:])
            text = self.target.tokenizer.decode(list(ids))
            return GenerationResult(tokens=ids, text=text, decoder=self.name, finish_reason="length",
                                    timing=Timing(wall_s=0.01, ttft_s=0.01, token_times_s=(0.01,) * len(ids)))
''')


@pytest.fixture
def own_package(tmp_path, monkeypatch):
    pkg = tmp_path / "teamdecoders"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rev.py").write_text(OWN_DECODER)
    # An installed distribution registering it under the entry-point group, as pip would leave it.
    dist = tmp_path / "teamdecoders-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: teamdecoders\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[decodegate.decoders]\nteam-reverse = teamdecoders.rev:Reverse\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("teamdecoders")]:
        del sys.modules[mod]


def test_own_decoder_by_path_and_by_entry_point(own_package):
    assert get_decoder_class("teamdecoders.rev:Reverse").name == "reverse"
    assert get_decoder_class("team-reverse").name == "reverse"
    with pytest.raises(DecoderError, match="has no class 'Revers'"):
        get_decoder_class("teamdecoders.rev:Revers")
    with pytest.raises(DecoderError, match="did you mean 'team-reverse'"):
        get_decoder_class("team-revers")


def test_own_decoder_runs_through_regress(own_package, tmp_path):
    from harness.cli import main
    suite = tmp_path / "s.jsonl"
    rows = [{"suite": "s", "version": "1", "description": "own-decoder suite", "smoke": ["a", "b"],
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}},
            {"id": "a", "prompt": "hello there", "references": ["zz"]},
            {"id": "b", "prompt": "good morning", "references": ["zz"]}]
    suite.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""target = "tiny-llama"
[baseline]
decoder = "teamdecoders.rev:Reverse"
[[candidates]]
name = "same"
decoder = "team-reverse"
[[candidates]]
name = "flipped"
decoder = "teamdecoders.rev:Reverse"
options = {{ flip = true }}
[suites.s]
path = "{suite}"
[profiles.smoke]
subset = "smoke"
suites = ["s"]
""")
    run_dir = tmp_path / "run"
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["candidates"]["same"]["verdict"] == "pass"
    assert summary["candidates"]["flipped"]["verdict"] == "fail"  # its outputs moved: identity caught it
    assert code == 1


def test_llamacpp_samples_in_the_in_process_order():
    # Temperature before top-p: llama.cpp's own order cuts the nucleus on the untempered softmax,
    # which at T != 1 is another distribution than the in-process decoders (and the reference) draw from.
    from decoders.engines.llamacpp import completion_body
    body = completion_body(GenerationRequest((1, 2, 3), max_new_tokens=4, temperature=0.7, top_p=0.9), {})
    order = body["samplers"]
    assert order.index("temperature") < order.index("top_p") and body["top_k"] == 0 and body["min_p"] == 0.0


def test_vllm_prompt_logprobs_keep_the_top_k_only():
    from decoders.engines.openai_compat import parse_prompt_logprobs
    choice = {"prompt_logprobs": [None, {"5": {"logprob": -0.1, "rank": 1}},
                                  {"7": {"logprob": -0.2, "rank": 1}, "9": {"logprob": -9.0, "rank": 40}}]}
    # The prompt's own token at rank 40 is dropped: what is known must not depend on the token.
    assert parse_prompt_logprobs(choice, 1, 2, k=20) == [{5: -0.1}, {7: -0.2}]
    with pytest.raises(ValueError):
        parse_prompt_logprobs(choice, 2, 2, k=20)


def test_sglang_input_top_logprobs_per_position():
    from decoders.engines.sglang import parse_input_top_logprobs
    meta = {"input_top_logprobs": [[[-0.1, 5, "a"], [-2.0, 6, "b"]], [[-0.3, 8, "c"]]]}
    assert parse_input_top_logprobs(meta, 2) == [{5: -0.1, 6: -2.0}, {8: -0.3}]
