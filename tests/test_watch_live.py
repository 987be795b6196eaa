"""`watch` and `export-monitoring` without a real engine, on real components otherwise: reference
run folders written in the shape `regress` writes, an engine stand-in that is a real HTTP server
serving the captured vLLM /metrics (tests/data/vllm) with counters the test moves, watch run as
the console command, its own /metrics scraped, the exported rules run by `promtool test rules`.

The real engines are in test_watch_engine.py (llama.cpp) and test_vllm.py (vLLM)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from decoders.engines.server import free_port
from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
VLLM = ROOT / "tests" / "data" / "vllm"


def write_reference(folder: Path, requests: list[tuple[int, int, float]], *, engine: str | None = "vLLM",
                    decoder: str = "vllm", name: str = "ngram") -> Path:
    """A finished run folder: summary.json and records.jsonl with one candidate whose requests
    drafted `n` and accepted `a` tokens at temperature `t` ((a, n, t) per request)."""
    folder.mkdir(parents=True, exist_ok=True)
    cand = {"decoder": decoder, "labels": {"team": "inference-platform"}}
    if engine:
        cand["engine"] = {"engine": engine}
    summary = {"target": "smollm2-135m", "labels": {"chargeback": "llm-serving"}, "candidates": {name: cand}}
    (folder / "summary.json").write_text(json.dumps(summary))
    rows = [{"candidate": name, "suite": "s", "item_id": f"i{i}", "seed": 0, "temperature": t,
             "stats": {"proposed": n, "accepted": a}} for i, (a, n, t) in enumerate(requests)]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def steady_requests(count: int = 40, p: float = 0.6, n: int = 50, t: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(int(rng.binomial(n, p)), n, t) for _ in range(count)]


# --------------------------------------------------------------------------- engine names

def test_a_vllm_candidate_is_exported_with_vllm_names_only(tmp_path):
    ref = write_reference(tmp_path / "ref", steady_requests())
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m")]) == 0
    rules = (tmp_path / "m" / "decodegate-rules.yml").read_text()
    dash = (tmp_path / "m" / "decodegate-dashboard.json").read_text()
    for text in (rules, dash):
        assert "llamacpp:" not in text
        assert "vllm:spec_decode_num_draft_tokens_total" in text
    assert "vllm:generation_tokens_total" in rules
    # Every engine series the exports read is one a real vLLM server exported (the capture).
    scraped = {line.split("{")[0].split()[0] for line in (VLLM / "ngram-metrics-after.txt").read_text().splitlines()
               if line and not line.startswith("#")}
    used = set(re.findall(r"vllm:[a-z0-9_]+", rules + dash))
    assert used and used <= scraped, used - scraped


@pytest.mark.parametrize("engine,decoder,says", [
    ("sglang", "sglang", "ran on engine 'sglang'"),
    (None, "speculative", "not on a serving engine"),
])
def test_an_engine_without_verified_names_is_refused_not_defaulted(engine, decoder, says, tmp_path, capsys):
    ref = write_reference(tmp_path / "ref", steady_requests(), engine=engine, decoder=decoder)
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "llama.cpp and vllm only" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("requests", [[(0, 50, 0.0)] * 20, [(1, 500, 0.0)] * 3 + [(0, 500, 0.0)] * 17])
def test_a_reference_without_acceptance_to_fall_from_is_refused_by_export_monitoring(requests, tmp_path, capsys):
    """Its boundary is 0: `ratio < 0 - 3 * ...` passes promtool and can never fire. watch refuses
    it; export-monitoring must too, not write a silent alert."""
    ref = write_reference(tmp_path / "ref", requests)
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no acceptance to fall from" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m").exists()


# --------------------------------------------------------------------------- an engine stand-in

class Engine:
    """A real HTTP server answering /metrics with vLLM's captured exposition text, its counters
    set by the test: `mode` "spec" (the n-gram server's capture), "plain" (the capture of vLLM
    without speculation: no spec-decode series), "html" or "empty" (a proxy's odd answers)."""

    COUNTERS = {"spec": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                         "vllm:spec_decode_num_drafts_total", "vllm:generation_tokens_total")}

    def __init__(self):
        self.drafted = self.accepted = self.generated = 0.0
        self.mode = "spec"
        self.lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body, ctype = engine.body()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, drafted: float, accepted: float, generated: float | None = None) -> None:
        with self.lock:
            self.drafted += drafted
            self.accepted += accepted
            self.generated += drafted if generated is None else generated

    def body(self) -> tuple[bytes, str]:
        with self.lock:
            mode, values = self.mode, {"vllm:spec_decode_num_draft_tokens_total": self.drafted,
                                       "vllm:spec_decode_num_accepted_tokens_total": self.accepted,
                                       "vllm:spec_decode_num_drafts_total": self.drafted / 4,
                                       "vllm:generation_tokens_total": self.generated}
        if mode == "html":
            return b"<html><body>502 Bad Gateway</body></html>\n", "text/html"
        if mode == "empty":
            return b"", "text/plain"
        text = (VLLM / ("ngram-metrics-after.txt" if mode == "spec" else "plain-metrics.txt")).read_text()
        for name, value in values.items():
            text = re.sub(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value!r}", text, flags=re.M)
        return text.encode(), "text/plain; version=0.0.4"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    e = Engine()
    yield e
    e.close()


def start_watch(engine_url: str, reference: Path, tmp: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "harness.cli", "watch", "--engine", engine_url, "--reference", str(reference),
           "--interval", "0.1", "--min-drafted", "64", "--listen", f"127.0.0.1:{port}", "--log", str(tmp / "watch.jsonl"),
           *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc, port


def scrape_watch(port: int, wait_s: float = 60) -> str:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("watch did not serve /metrics")


def sample(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, flags=re.M)
    return None if m is None else float(m.group(1))


def wait_for(predicate, port: int, feed=None, wait_s: float = 60) -> str:
    """Scrape watch until `predicate(text)` holds (feeding the engine meanwhile)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if feed:
            feed()
        text = scrape_watch(port)
        if predicate(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"watch's /metrics never showed it; last:\n{text[-2000:]}")


def finish(proc: subprocess.Popen, sig=None) -> tuple[int, str, str]:
    if sig is not None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


# --------------------------------------------------------------------------- alarms that stay raised

def test_an_alarm_stays_raised_on_metrics_until_watch_is_stopped(engine, tmp_path):
    import signal
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1")
    try:
        assert sample(scrape_watch(port), "decodegate_alarm") == 0
        # Acceptance collapses to 0.1: the alarm comes, and stays while the engine keeps going.
        text = wait_for(lambda t: sample(t, "decodegate_alarm") == 1, port, feed=lambda: engine.serve(64, 6))
        assert 'kind="acceptance_below_reference"' in text
        for _ in range(10):
            engine.serve(64, 40)  # acceptance back to normal: the alarm still holds
            time.sleep(0.1)
            text = scrape_watch(port)
            assert sample(text, "decodegate_alarm") == 1 and proc.poll() is None
        assert sample(text, "decodegate_alarms_total") == 1
    finally:
        code, out, err = finish(proc, signal.SIGTERM)
    assert code == 4, (out, err)
    assert out.count("ALARM") == 1 and "still raised" in out


@pytest.mark.full  # two watch processes (12 s); an alarm that stays until watch is stopped is in make check above
def test_acknowledge_clears_the_alarm_and_exit_on_alarm_keeps_the_old_behaviour(engine, tmp_path):
    import signal
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1")
    try:
        wait_for(lambda t: sample(t, "decodegate_alarm") == 1, port, feed=lambda: engine.serve(64, 6))
        proc.send_signal(signal.SIGUSR1)
        text = wait_for(lambda t: sample(t, "decodegate_alarm") == 0, port, feed=lambda: engine.serve(64, 40))
        assert 'kind="none"' in text
    finally:
        code, out, err = finish(proc, signal.SIGTERM)
    assert code == 0 and "acknowledged" in out, (out, err)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1", "--exit-on-alarm", "--max-duration", "60")
    scrape_watch(port)
    while proc.poll() is None:
        engine.serve(64, 6)
        time.sleep(0.05)
    code, out, err = finish(proc)
    assert code == 4 and "ALARM" in out, (out, err)


# --------------------------------------------------------------------------- speculation stopped

@pytest.mark.full
def test_a_relaunch_without_speculation_is_an_alarm_of_its_own(engine, tmp_path):
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1", "--max-duration", "60",
                             "--stopped-tokens", "200")
    try:
        scrape_watch(port)
        engine.mode = "plain"  # vLLM relaunched without --speculative-config: no spec_decode series at all
        text = wait_for(lambda t: sample(t, "decodegate_alarm") == 1, port, feed=lambda: engine.serve(0, 0, 30))
        assert 'kind="speculation_stopped"' in text
    finally:
        code, out, err = finish(proc, 15)
    assert code == 4, (out, err)
    line = [x for x in out.splitlines() if "ALARM" in x]
    assert len(line) == 1 and "speculation stopped" in line[0] and "series are gone" in line[0]


@pytest.mark.full  # a watch process (4 s); speculation stopped stays in make check with the relaunch above
def test_drafting_that_stands_still_while_generating_is_speculation_stopped(engine, tmp_path):
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1", "--max-duration", "60",
                             "--stopped-tokens", "200")
    try:
        scrape_watch(port)
        wait_for(lambda t: sample(t, "decodegate_alarm") == 1, port, feed=lambda: engine.serve(0, 0, 30))
    finally:
        code, out, err = finish(proc, 15)
    assert code == 4 and "it drafts nothing" in out, (out, err)


# --------------------------------------------------------------------------- failed scrapes

# Each case is a watch process fed until it counts three failed scrapes (3.5-5 s): `make check` keeps
# one of each kind (a page that is not metrics; a counter that is not a count), `make test` the rest.
@pytest.mark.parametrize("mode", ["html", pytest.param("empty", marks=pytest.mark.full)])
def test_an_odd_scrape_is_counted_not_fatal(mode, engine, tmp_path):
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1", "--max-duration", "60")
    try:
        scrape_watch(port)
        engine.mode = mode
        wait_for(lambda t: (sample(t, "decodegate_scrape_failures_total") or 0) >= 3, port)
        engine.mode = "spec"
        before = sample(scrape_watch(port), "decodegate_watched_draft_tokens_total")
        wait_for(lambda t: sample(t, "decodegate_watched_draft_tokens_total") > before, port,
                 feed=lambda: engine.serve(64, 38))
        assert proc.poll() is None
    finally:
        code, out, err = finish(proc, 15)
    assert code == 0 and "ALARM" not in out, (out, err)


@pytest.mark.parametrize("bad", ["nan", pytest.param("inf", marks=pytest.mark.full),
                                 pytest.param("-5.0", marks=pytest.mark.full)])
def test_a_spec_counter_that_is_not_a_count_is_a_failed_scrape_not_a_crash(bad, engine, tmp_path):
    """A proxy or exporter bug serving NaN, +Inf or a negative drafted counter: counted as a failed
    scrape (decodegate_scrape_failures_total), not an internal error, and watch goes on."""
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1", "--max-duration", "60")
    try:
        scrape_watch(port)
        good = engine.drafted
        with engine.lock:
            engine.drafted = float(bad)
        wait_for(lambda t: (sample(t, "decodegate_scrape_failures_total") or 0) >= 3, port)
        with engine.lock:
            engine.drafted = good
        before = sample(scrape_watch(port), "decodegate_watched_draft_tokens_total")
        wait_for(lambda t: sample(t, "decodegate_watched_draft_tokens_total") > before, port,
                 feed=lambda: engine.serve(64, 38))
        assert proc.poll() is None
    finally:
        code, out, err = finish(proc, 15)
    assert code == 0 and "ALARM" not in out and "internal error" not in err, (out, err)


@pytest.mark.full
def test_a_run_of_failed_scrapes_past_the_limit_ends_watch_with_the_last_answer(engine, tmp_path):
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--max-scrape-failures", "5", "--max-duration", "60")
    scrape_watch(port)
    engine.mode = "html"
    code, out, err = finish(proc)
    assert code == 2, (out, err)
    assert "6 scrapes of" in err and "--max-scrape-failures 5" in err and "<html><body>502 Bad Gateway" in err
    assert len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- references that carry a guarantee

@pytest.mark.parametrize("requests", [[(5, 8, 0.0)], [(5, 8, 0.0), (0, 0, 0.0), (0, 0, 0.0)]])
def test_a_one_request_reference_is_refused_with_how_many_are_needed(requests, tmp_path, capsys):
    ref = write_reference(tmp_path / "ref", requests)
    for argv in (["watch", "--engine", "http://127.0.0.1:9", "--reference", str(ref)],
                 ["export-monitoring", str(ref), "--out", str(tmp_path / "m")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "drafted in 1 request(s)" in err and "needs at least 2 drafting requests" in err, err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "m").exists()


def test_the_reference_is_taken_per_temperature(tmp_path, capsys):
    from harness.verdict import live_reference
    ref = write_reference(tmp_path / "ref", steady_requests(30, 0.7) + steady_requests(30, 0.3, t=0.7, seed=1))
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"several temperatures \(T=0: 0\.(69|70)\d, T=0\.7: 0\.(29|30|31)\d\)", err) and "--temperature" in err, err
    cold, warm = (live_reference.load(str(ref), temperature=t) for t in (0.0, 0.7))
    assert cold.requests == warm.requests == 30 and cold.temperature == 0.0 and warm.temperature == 0.7
    assert cold.low > 0.6 and warm.high < 0.4
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m"), "--temperature", "0.7"]) == 0
    assert f"{warm.boundary():.4g}" in (tmp_path / "m" / "decodegate-rules.yml").read_text()
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m"), "--temperature", "1"]) == 2
    assert "no drafting request at --temperature 1 (it has: 0, 0.7)" in capsys.readouterr().err


# --------------------------------------------------------------------------- every derived number, checked

def test_every_number_watch_and_the_rules_derive_is_the_one_computed_independently(engine, tmp_path):
    """From the run's records, by hand: accepted/drafted, its interval (a delta-method interval over
    prompts, against the code's bootstrap), φ (Pearson χ² / df) and its 95% upper bound, the
    boundary, and the detector's h for the ARL asked; then read back from what watch serves and
    what export-monitoring writes."""
    from scipy import stats

    from analysis.lr_cusum import design
    rng = np.random.default_rng(7)
    n = rng.integers(20, 90, size=60)
    a = rng.binomial(n, rng.beta(12, 6, size=60))
    ref = write_reference(tmp_path / "ref", [(int(x), int(y), 0.0) for x, y in zip(a, n)])
    ratio = a.sum() / n.sum()
    resid = a - ratio * n                                   # delta method for a ratio of sums over prompts
    se = np.sqrt(len(n) / (len(n) - 1) * np.sum(resid ** 2)) / n.sum()
    low, high = ratio - 1.96 * se, ratio + 1.96 * se
    phi = max(1.0, float(np.sum((a - ratio * n) ** 2 / (ratio * (1 - ratio) * n))) / (len(n) - 1))
    phi_up = max(1.0, phi * (len(n) - 1) / stats.chi2.ppf(0.05, len(n) - 1))
    tolerance = 0.05
    boundary = low * (1 - tolerance)
    h = design(boundary, 0.10, 64, phi_up, 2 * 3600 / 0.1).h   # --arl-hours 2 at --interval 0.1

    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m")]) == 0
    rule = next(r for r in yaml.safe_load((tmp_path / "m" / "decodegate-rules.yml").read_text())["groups"][0]["rules"]
                if r.get("alert") == "SpecDecodeAcceptanceBelowReference")
    p0_rule, phi_rule = (float(x) for x in re.search(r"< ([\d.]+) - 3 \* sqrt\(([\d.]+) \*", rule["expr"]).groups())
    assert p0_rule == pytest.approx(boundary, abs=2e-3) and phi_rule == pytest.approx(phi_up, rel=1e-3)

    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "2", "--max-duration", "60")
    try:
        text = scrape_watch(port)
    finally:
        code, out, err = finish(proc, 15)
    assert code == 0, (out, err)
    assert sample(text, "decodegate_reference_acceptance_ratio") == pytest.approx(ratio, rel=1e-9)
    # The code's bootstrap over prompts and the delta method agree within 0.003 on 60 prompts; a 90%
    # interval or a tolerance of 0.04 or 0.06 would move the boundary by more than that.
    assert sample(text, "decodegate_reference_acceptance_lower_ratio") == pytest.approx(low, abs=3e-3)
    assert sample(text, "decodegate_reference_acceptance_upper_ratio") == pytest.approx(high, abs=3e-3)
    assert sample(text, "decodegate_acceptance_boundary_ratio") == pytest.approx(boundary, abs=3e-3)
    assert sample(text, "decodegate_cusum_threshold") == pytest.approx(h, rel=0.02)
    assert f"φ {phi_up:.2f}: the upper bound of {phi:.2f} measured over 60 requests" in out


@pytest.mark.full
def test_an_alarm_that_stands_when_the_engine_stops_answering_still_exits_4(engine, tmp_path):
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1", "--max-scrape-failures", "3",
                             "--max-duration", "60")
    try:
        wait_for(lambda t: sample(t, "decodegate_alarm") == 1, port, feed=lambda: engine.serve(64, 6))
        engine.mode = "empty"
    finally:
        code, out, err = finish(proc)
    assert code == 4 and "the engine stopped answering with the alarm" in out, (out, err)
    assert "4 scrapes of" in err


@pytest.mark.full  # a watch process (7 s); the standing alarm's exit 4 stays in make check with the engine gone
def test_an_alarm_that_stands_when_counters_turn_unreadable_still_exits_4(engine, tmp_path):
    """Counters that go backwards with no sign of a restart end watch (an input error), but an
    alarm already raised must not be lost to exit 2: a script reading the exit code would see
    'input error' where acceptance had collapsed."""
    ref = write_reference(tmp_path / "ref", steady_requests())
    engine.serve(100, 60)
    proc, port = start_watch(engine.url, ref, tmp_path, "--arl-hours", "1", "--max-duration", "60")
    try:
        wait_for(lambda t: sample(t, "decodegate_alarm") == 1, port, feed=lambda: engine.serve(64, 6))
        with engine.lock:
            engine.drafted, engine.accepted = engine.drafted - 50, engine.accepted - 10
    finally:
        code, out, err = finish(proc)
    assert code == 4 and "with the alarm (acceptance_below_reference) still raised" in out, (out, err)
    assert "went backwards" in err
