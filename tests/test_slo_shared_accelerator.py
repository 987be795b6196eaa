"""Issue 49, suspicion 7b (harness/verdict/slo.py): a baseline level read as "over capacity", and so
not gated, because the engine played just before it (another candidate sharing the accelerator)
was still busy with requests the client had abandoned. Records as harness.run.load writes them:
load.jsonl rows and load_levels.jsonl in play order (each rate: the baseline, then each candidate)."""
import json

import pytest

from harness.config import load_config
from harness.verdict.load import apply


def _row(i, ttft, *, error=None):
    r = {"index": i, "offset_s": float(i), "suite": "factual", "item_id": f"i{i % 7}", "seed": 0,
         "temperature": 0.0, "lag_s": 0.001, "cap_wait_s": 0.0, "sent_s": float(i)}
    if error:  # as harness.run.load.play writes a refused, dropped or timed-out request
        return {**r, "error": error, "n_tokens": 0, "stats": {}, "done_s": i + 30.0}
    times = [ttft] + [0.05] * 9
    return {**r, "ttft_s": ttft, "e2e_s": sum(times), "token_times_s": times, "n_tokens": len(times),
            "finish_reason": "length", "stats": {}, "tokens": list(range(len(times))), "done_s": i + sum(times),
            "error": None}


def _config(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("""target = "smollm2-135m"
[engines.a]
base_url = "http://127.0.0.1:1"
[baseline]
decoder = "llama.cpp"
options = { engine = "a" }
[[candidates]]
name = "c"
decoder = "llama.cpp"
options = { engine = "a" }
[[candidates]]
name = "d"
decoder = "llama.cpp"
options = { engine = "a" }
[profiles.load]
subset = "smoke"
suites = ["factual"]
rates = [1, 2]
load_requests = 60
[profiles.load.slo]
ttft_p95_s = 1.0
""")
    return load_config(p, "load")


def _folder(tmp_path, d_error: str):
    """1 req/s: every side meets the TTFT objective, but d's client gave up on 12 requests; 2 req/s
    (played next, on the same accelerator): the baseline misses the objective, and so does c."""
    n = 60
    plays = [(1.0, "baseline", [_row(i, 0.2) for i in range(n)]),
             (1.0, "c", [_row(i, 0.1) for i in range(n)]),
             (1.0, "d", [_row(i, 0.1, error=d_error if i % 5 == 0 else None) for i in range(n)]),
             (2.0, "baseline", [_row(i, 1.5) for i in range(n)]),
             (2.0, "c", [_row(i, 1.4) for i in range(n)]),
             (2.0, "d", [_row(i, 0.1) for i in range(n)])]
    rows = [{**r, "candidate": name, "rate": rate} for rate, name, side in plays for r in side]
    (tmp_path / "load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    levels = [{"candidate": name, "rate": rate, "wall_s": n / rate, "requests": n, "refine": False}
              for rate, name, _ in plays]
    (tmp_path / "load_levels.jsonl").write_text("".join(json.dumps(lv) + "\n" for lv in levels))
    return tmp_path


def _slo_gate(summary, name):
    return next(g for g in summary["candidates"][name]["gates"] if g["name"] == "slo ttft_p95_s")


def test_a_baseline_level_after_abandoned_requests_is_not_left_ungated(tmp_path):
    """c misses the objective at 2 req/s. Before: the baseline's slow level read "over capacity", c's
    SLO gate passed ("met wherever the baseline meets it"). Now that level is inconclusive, naming d's
    abandoned requests, and c does not pass."""
    cfg = _config(tmp_path)
    summary = {"baseline": "baseline", "candidates": {n: {"verdict": "pass", "gates": []} for n in ("c", "d")}}
    apply(summary, cfg, _folder(tmp_path, "ReadTimeout: timed out"))
    gate = _slo_gate(summary, "c")
    assert gate["status"] != "pass", gate["detail"]
    assert "2 req/s: INCONCLUSIVE" in gate["detail"]
    assert "d at 1 req/s left 12 request(s) unanswered (ReadTimeout" in gate["detail"], gate["detail"]
    assert summary["candidates"]["c"]["verdict"] == "fail"


@pytest.mark.parametrize("error", ["HTTP 503: busy", "ConnectError: All connection attempts failed"])
def test_requests_that_left_no_work_keep_the_level_over_capacity(tmp_path, error):
    """Requests the engine refused, or that never reached it, left no work behind: the baseline's
    slow level is its own, over capacity, not gated (c passes on the level the baseline meets)."""
    cfg = _config(tmp_path)
    summary = {"baseline": "baseline", "candidates": {n: {"verdict": "pass", "gates": []} for n in ("c", "d")}}
    apply(summary, cfg, _folder(tmp_path, error))
    gate = _slo_gate(summary, "c")
    assert gate["status"] == "pass" and "2 req/s: over capacity" in gate["detail"], gate["detail"]
