"""`decodegate bench` on tiny models: every decoder runs, ratios and theory are reported.
(Speeds themselves are never asserted: timings on a shared CPU are noise.)"""
from __future__ import annotations

import json
import statistics

import pytest

from harness.cli import main


# `full`: every decoder at two temperatures with a profiled round (20 s of a 2-core machine): bench
# measures and decides nothing. Its comparison of old and new caches stays in `make check`.
@pytest.mark.full
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
    # achieved/theory reads the decode phase's speedup (the theory's own), reported beside the speedup
    assert spec["achieved_over_theoretical"] == pytest.approx(spec["decode_speedup"] / spec["theoretical_speedup"])
    roof = res["roofline"]
    assert roof["standard_over_bound"] > 0
    # The bound's bandwidth: one probe before every prompt and temperature of every round, between
    # the decoders, and their median; the best probe's (tighter) bound beside it.
    probes = roof["memory_bandwidth_probes_gbs"]
    assert len(probes) == 1 * len(res["prompts"]) * 2 and all(p > 0 for p in probes)
    assert roof["memory_bandwidth_gbs"] == pytest.approx(statistics.median(probes))
    assert roof["best_probe_gbs"] == max(probes)
    assert roof["standard_over_best_probe_bound"] >= roof["standard_over_bound"]
    assert f"median of {len(probes)} probes" in text
    # The kill switch stops an unrelated draft and leaves the target's own layers drafting.
    assert res["decoders"]["spec[tiny-qwen2]"]["T=0"]["fallbacks"] > 0
    assert set(res["profile"]) == {"spec[tiny-qwen2]", "spec[prompt-lookup]", "spec[self:2]"}
    # The torch-profiler split of a step, for standard and every in-process candidate.
    assert {"standard", "spec[tiny-qwen2]", "spec[prompt-lookup]", "early-exit[0.5]"} <= set(res["step_profile"])
    for label, prof in res["step_profile"].items():
        fr = prof["fractions"]
        assert all(0 <= v <= 1 for v in fr.values()) and sum(fr.values()) == pytest.approx(1, abs=0.02), label
        assert prof["steps"] >= 1 and prof["ms_per_step"] > 0
    std = res["step_profile"]["standard"]["fractions"]
    assert std["lm_head"] > 0 and std["attention"] > 0 and std["mlp"] > 0 and std["kv_cache"] > 0
    assert std["sampling"] > 0 and std["verify"] == 0
    assert res["step_profile"]["spec[tiny-qwen2]"]["fractions"]["verify"] > 0
    assert res["step_profile"]["spec[tiny-qwen2]"]["fractions"]["draft_forward"] > 0
    assert "step profile standard" in text


def test_bench_compare_old_runs_both_caches_side_by_side(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--target", "tiny-llama", "--draft", "prompt-lookup", "--thresholds", "", "--max-new-tokens",
               "12", "--rounds", "1", "--temperatures", "0", "--compare-old", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert {"standard", "standard@dynamic", "spec[prompt-lookup]", "spec[prompt-lookup]@dynamic",
            "hf-assisted[prompt-lookup]"} <= set(res["decoders"])
    assert res["decoders"]["standard@dynamic"]["options"] == {"cache": "dynamic"}
    # Same tokens whichever cache: the old path is the reference of the new one.
    assert res["decoders"]["standard@dynamic"]["T=0"]["identity"] == 1.0
    assert res["decoders"]["spec[prompt-lookup]@dynamic"]["T=0"]["identity"] == 1.0
    g = res["goals"]
    for name in ("standard_over_roofline", "verify_k1_in_steps", "greedy_lookup_over_theory",
                 "greedy_lookup_end_to_end_over_theory", "spec[prompt-lookup] over hf-assisted[prompt-lookup] T=0"):
        assert set(g[name]) == {"new", "old"} and all(v > 0 for v in g[name].values()), name
    assert "goals (issue 26)" in text and "(dynamic cache)" in text


def test_bench_bad_k_is_an_input_error(capsys):
    assert main(["bench", "--target", "tiny-llama", "--k", "0"]) == 2
    assert "--k" in capsys.readouterr().err
