"""Open-loop load through `regress` against real llama.cpp servers the run starts itself.

One tiny run (2 rates, 4 short prompts without the chat template, 4 tokens, 32 requests per level:
the least with an 80% upper bound on a p95, so the gates run at alpha = 0.2) with a plain
baseline, an n-gram candidate and a draft-model candidate that is slower at every level (the
same GGUF as its own draft). Checked on it:
- the schedule: the same items at the same offsets for the baseline and every candidate;
- every metric at every level (TTFT, TPOT, ITL, E2E, throughput, goodput, speedup, acceptance),
  the harness's overhead, the report's tables, figures/load.png, and MLflow's copy of the numbers;
- SLOs: the run's loose ones pass; an impossibly tight TTFT objective is over capacity at every
  level (the baseline misses it too) and not gated; an E2E objective at the baseline's own p95
  fails the slow candidate wherever the baseline meets it;
- the slow candidate is not shown to pay at any level;
- faults: the n-gram server is killed after its first level, so it refuses every request of the
  second: error rows for that level only, its first level intact, and the run goes on.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.run.records import read_records

# Every test here runs a real llama.cpp: proven once by conftest's fixture, or failed with its message.
pytestmark = pytest.mark.usefixtures("llama_server")


def _pid_serving(port: str) -> int | None:
    """The pid of the llama-server listening on `port` (from /proc, by its exact command line)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in cmd and cmd[cmd.index(b"--port") + 1] == port.encode() and b"llama-server" in cmd[0]:
            return int(entry.name)
    return None


def _kill_after_first_level(run_dir: Path, name: str, stop: threading.Event, killed: list) -> None:
    """Kill `name`'s engine once its first load level is written (its second level has not started:
    the other decoders play in between)."""
    while not stop.is_set():
        levels = read_records(run_dir, "load_levels.jsonl") if (run_dir / "load_levels.jsonl").exists() else []
        if any(lv["candidate"] == name for lv in levels):
            log = (run_dir / f"engine-{name}.log").read_text()
            port = log.split("--port ", 1)[1].split()[0]
            pid = _pid_serving(port)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_rate_sweep_slos_crossover_and_a_refusing_level(tmp_path):
    from harness.cli import main
    from harness.config import Slo, load_config
    from harness.verdict import load as load_verdict
    from harness.verdict import slo as slo_gates
    from test_engines import engine_config, launch_args, write_suite
    from harness.run.engines import gguf
    suite = write_suite(tmp_path, n=4)
    engines = {"plain": launch_args("-np", "4", "--spec-type", "none"),
               "ngram": launch_args("-np", "4", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                                    "--spec-ngram-simple-size-m", "8"),
               "slow": launch_args("-np", "4", "--spec-type", "draft-simple", "--spec-draft-model",
                                   gguf("smollm2-135m"), "--spec-draft-n-max", "4", "--spec-draft-threads", "1")}
    cfg = engine_config(tmp_path, suite, engines, [("ngram", "ngram"), ("slow", "slow")],
                        profile_extra="max_new_tokens = 4\nrates = [1.5, 6]\nload_requests = 32\nrefine_levels = 0\n"
                                      "[profiles.smoke.slo]\nttft_p95_s = 900\ntpot_p95_s = 900\ne2e_p95_s = 900\n"
                                      "[gates]\nalpha = 0.2\n")
    # This machine is small and busy: short prompts, and time enough for a queue to drain.
    cfg.write_text(cfg.read_text().replace('target = "smollm2-135m"\n', 'target = "smollm2-135m"\nchat = false\n')
                   .replace('model = "smollm2-135m"\n', 'model = "smollm2-135m"\nrequest_timeout_s = 900\n'))
    run_dir = tmp_path / "run"
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_after_first_level, args=(run_dir, "ngram", stop, killed), daemon=True)
    watcher.start()
    try:
        code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"])
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert killed, "the n-gram engine was never killed"
    summary = json.loads((run_dir / "summary.json").read_text())
    load = summary["load"]
    rows = read_records(run_dir, "load.jsonl")
    assert load["rates"] == [1.5, 6.0]

    # The same schedule for everyone: index -> (offset, item) agrees across decoders at each rate.
    for rate in (1.5, 6.0):
        plans = {}
        for r in rows:
            if r["rate"] == rate:
                plans.setdefault(r["candidate"], {})[r["index"]] = (r["offset_s"], r["item_id"])
        assert set(plans) == {"base", "ngram", "slow"} and len(plans["base"]) == 32
        assert plans["base"] == plans["ngram"] == plans["slow"]

    by = {(e["decoder"], e["rate"]): e for e in load["levels"]}
    for name in ("base", "slow"):
        for rate in (1.5, 6.0):
            m = by[(name, rate)]["metrics"]
            assert m["n"] == 32 and m["errors"] == 0
            for metric in ("ttft", "tpot", "itl", "e2e"):
                assert m[metric]["p50"] > 0 and m[metric]["p90"] >= m[metric]["p50"], (name, rate, metric)
                assert m[metric]["p50_ci"][0] is not None
            assert m["e2e"]["p99"] is None and m["e2e"]["p99_needs_n"] == 100  # 32 requests: no p99
            assert m["output_throughput_tok_s"]["value"] > 0 and m["goodput_rps"]["value"] > 0
            assert set(m["slo"]) == {"ttft_p95_s", "tpot_p95_s", "e2e_p95_s"}
    slow3 = by[("slow", 1.5)]
    assert slow3["speedup"]["statistic"] > 0 and slow3["speedup"]["n"] == 32
    acc = slow3["metrics"]["acceptance"]
    assert acc["per_token"]["value"] > 0 and "per request" in acc["per_request"]["weighting"]
    assert acc["level"]["source"].startswith("prometheus")  # the level's counters, beside the per-request α
    overhead = load["overhead"]
    assert overhead["rate"] == 6.0 and overhead["by_decoder"]["base"]["harness_cpu_per_request_s"] > 0

    # Faults: the n-gram server refused every request of its second level, only that level.
    ng1, ng6 = by[("ngram", 1.5)]["metrics"], by[("ngram", 6.0)]["metrics"]
    assert ng1["errors"] == 0 and ng1["n"] == 32
    assert ng6["errors"] == 32 and not by[("ngram", 6.0)]["pays"] and "requests failed" in by[("ngram", 6.0)]["why"]
    assert load["crossover"]["ngram"]["status"] in ("pays up to", "never pays")

    # The slow candidate (a draft as large as its target) never pays.
    assert load["crossover"]["slow"]["status"] == "never pays", load["crossover"]["slow"]
    assert "slow is not shown to pay at any level tried" in (run_dir / "report.txt").read_text()

    # The run's loose SLOs: the slow candidate passes them; the n-gram one fails where it refused.
    gates = {g["name"]: g for g in summary["candidates"]["slow"]["gates"]}
    assert all(gates[f"slo {k}"]["status"] == "pass" for k in ("ttft_p95_s", "tpot_p95_s", "e2e_p95_s"))
    ngram_e2e = next(g for g in summary["candidates"]["ngram"]["gates"] if g["name"] == "slo e2e_p95_s")
    assert ngram_e2e["status"] == "fail" and "6 req/s: FAIL" in ngram_e2e["detail"]
    assert code == 1 and summary["candidates"]["ngram"]["verdict"] == "fail"
    # Its failed requests are a gate of their own, SLOs or not; the slow candidate failed none.
    errs = next(g for g in summary["candidates"]["ngram"]["gates"] if g["name"] == "load errors")
    assert errs["status"] == "fail" and "6 req/s: the candidate failed 32 of 32" in errs["detail"]
    assert gates["load errors"]["status"] == "pass"

    # Other SLOs on the same rows: a TTFT objective no one meets is over capacity everywhere (not
    # gated); an E2E objective at the baseline's own p95 at the lower rate fails the slow candidate
    # wherever the baseline meets it.
    config = load_config(cfg, "smoke")
    tight_e2e = by[("base", 1.5)]["metrics"]["slo"]["e2e_p95_s"]["p95"]
    plan = dataclasses.replace(config.profile.load, slo=Slo(ttft_p95_s=1e-6, e2e_p95_s=tight_e2e))
    config = dataclasses.replace(config, profile=dataclasses.replace(config.profile, load=plan))
    other = load_verdict.summarize(config, rows, read_records(run_dir, "load_levels.jsonl"), "base")
    at = {(e["decoder"], e["rate"]): e["metrics"] for e in other["levels"]}
    levels = [{"rate": r, "baseline": at[("base", r)], "candidate": at[("slow", r)]} for r in (1.5, 6.0)]
    ttft, e2e = slo_gates.gates(levels, plan.slo.items(), config.gates)
    assert ttft.status == "warn" and "over capacity at every level" in ttft.detail
    for lv in levels:
        outcome, _ = slo_gates.level_outcome("e2e_p95_s", lv["baseline"], lv["candidate"])
        base_meets = lv["baseline"]["slo"]["e2e_p95_s"]["point_meets"]
        assert outcome == ("fail" if base_meets else "over capacity"), (lv["rate"], outcome)
    assert e2e.status == "fail" and "1.5 req/s: FAIL" in e2e.detail

    # The report, the figure and MLflow carry the same numbers.
    report = (run_dir / "report.txt").read_text()
    assert "open-loop load" in report and "TPOT" in report and "ITL misstates speculation" in report
    assert "harness overhead at 6 req/s" in report
    assert (run_dir / "figures" / "load.png").stat().st_size > 5000
    from harness.run import tracking
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = tracking.log_run(run_dir, uri)
    client = tracking._client(uri)
    logged = client.get_run(ids["slow"]).data.metrics
    assert logged["load.r1.5.tpot_p50_s"] == pytest.approx(by[("slow", 1.5)]["metrics"]["tpot"]["p50"])
    assert logged["load.crossover_rps"] == 0.0
    assert "figures/load.png" in [a.path for a in client.list_artifacts(ids["parent"], "figures")]
