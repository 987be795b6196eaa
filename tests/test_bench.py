"""`decodegate bench` on tiny models: every decoder runs, ratios and theory are reported.
(Speeds themselves are never asserted: timings on a shared CPU are noise.)"""
from __future__ import annotations

import json

from harness.cli import main


def test_bench_reports_every_decoder(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--target", "tiny-llama", "--draft", "tiny-qwen2,prompt-lookup,self:2", "--thresholds", "0.5",
               "--max-new-tokens", "16", "--rounds", "1", "--min-acceptance", "0.3", "--temperatures", "0,0.7", "--profile-round", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "roofline" in text and "by category" in text
    res = json.loads(out.read_text())
    labels = set(res["decoders"])
    assert {"standard", "hf", "spec[prompt-lookup]", "hf-assisted[prompt-lookup]", "spec[self:2]",
            "hf-assisted[tiny-qwen2]", "early-exit[0.5]"} <= labels
    spec = res["decoders"]["spec[tiny-qwen2]"]["T=0"]
    assert spec["identity"] == 1.0  # greedy speculative never changes tokens
    assert 0 <= spec["alpha"] <= 1 and spec["tau"] >= 1 and spec["theoretical_speedup"] > 0
    assert res["roofline"]["standard_over_bound"] > 0
    # The kill switch stops an unrelated draft and leaves the target's own layers drafting.
    assert res["decoders"]["spec[tiny-qwen2]"]["T=0"]["fallbacks"] > 0
    assert set(res["profile"]) == {"spec[tiny-qwen2]", "spec[prompt-lookup]", "spec[self:2]"}


def test_bench_bad_k_is_an_input_error(capsys):
    assert main(["bench", "--target", "tiny-llama", "--k", "0"]) == 2
    assert "--k" in capsys.readouterr().err
