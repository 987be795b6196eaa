"""`decodegate watch` and `export-monitoring` against a real llama.cpp server with n-gram
speculation (no mock): the reference is a real `regress` run on "copy" prompts (high acceptance);
live traffic is the same prompts through the server's chat route.

- no drift: counters recorded from the engine, replayed (resampled, time compressed) through the
  detector at the boundary of its promise; the measured ARL against the one set;
- injected drift: the traffic switches to lists of numbers and short answers (low acceptance);
  the time and drafted tokens the detector needed;
- a restart of the engine mid-watch: no alarm, a new epoch, every drafted token counted;
- bad input: an engine without spec-decode counters, a reference candidate that never drafted;
- the exported rules pass `promtool check rules`; every dashboard query names a metric that the
  engine or `watch` really exports (both scraped).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from analysis.drift_detector import counter_delta, dispersion, mean_run_length
from analysis.lr_cusum import design, replay_scrapes
from decoders.engines.server import EngineServer, EngineSpec, free_port
from harness.cli import main
from harness.run.engines import gguf, llama_tool
from harness.run.live_metrics import Scraper
from harness.verdict import live_reference

pytestmark = pytest.mark.full
ROOT = Path(__file__).resolve().parent.parent

COPY = ["Repeat exactly: the quick brown fox jumps over the lazy dog.",
        "Copy this sentence twice: I like green apples and red grapes.",
        "Repeat after me: one two three, one two three, one two three.",
        "Write the alphabet in capital letters separated by spaces.",
        "Count down from 40 to 1 separated by commas.",
        "Spell the word banana letter by letter, separated by dashes.",
        "Repeat exactly: red, blue, green, red, blue, green.",
        "Repeat exactly: to be or not to be, that is the question.",
        "Repeat exactly: Mary had a little lamb whose fleece was white as snow.",
        "Repeat exactly five times: the cat sat on the mat.",
        "Copy this sentence: the rain in Spain stays mainly in the plain.",
        "Write the numbers from 100 to 130 separated by spaces."]
# Lower acceptance with these n-gram settings: number lists draft and miss, short answers miss.
DRIFT = ["List the numbers from 1 to 30 separated by commas.",
         "List the even numbers from 2 to 60 separated by commas.",
         "What is the capital of France? Answer in a few words.",
         "Explain in one sentence what a hash table is."]
NEW_TOKENS = 48
LABELS = {"team": "inference-platform", "chargeback": "llm-serving"}


def server_args(spec: str, port: str = "{port}") -> list[str]:
    flags = (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]
             if spec == "ngram" else ["--spec-type", "none"])
    return [llama_tool("llama-server"), "-m", gguf("smollm2-135m"), "--host", "127.0.0.1", "--port", port,
            "--alias", "smollm2-135m", "-t", "1", "-np", "1", "--metrics", *flags]


def ask(base_url: str, prompt: str) -> None:
    r = httpx.post(base_url + "/v1/chat/completions", timeout=120,
                   json={"messages": [{"role": "user", "content": prompt}], "max_tokens": NEW_TOKENS, "temperature": 0})
    r.raise_for_status()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A real regress run: llama.cpp with n-gram speculation on the copy prompts (and a candidate
    on the plain server, which drafts nothing: a reference without acceptance)."""
    tmp = tmp_path_factory.mktemp("reference")
    rows = [{"suite": "copy", "version": "1", "description": "copy prompts", "smoke": [f"c{i}" for i in range(len(COPY))],
             "defaults": {"grader": "contains", "max_new_tokens": NEW_TOKENS, "stop": []}}]
    rows += [{"id": f"c{i}", "prompt": p, "references": ["the"], "categories": ["copy"]} for i, p in enumerate(COPY)]
    (tmp / "copy.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    engines = "".join(f"[engines.{n}]\nlaunch = {json.dumps(server_args(n))}\nmodel = \"smollm2-135m\"\n\n"
                      for n in ("plain", "ngram"))
    cands = "".join(f"[[candidates]]\nname = \"{n}\"\ndecoder = \"llama.cpp\"\nkind = \"exact\"\n"
                    f"options = {{ engine = \"{e}\" }}\n\n" for n, e in (("ngram", "ngram"), ("plain-again", "plain")))
    labels = "".join(f'{k} = "{v}"\n' for k, v in LABELS.items())
    (tmp / "engine.toml").write_text(f"""target = "smollm2-135m"
[labels]
{labels}
{engines}
[baseline]
name = "base"
decoder = "llama.cpp"
options = {{ engine = "plain" }}

{cands}
[suites.copy]
path = "{tmp / 'copy.jsonl'}"

[profiles.smoke]
subset = "smoke"
suites = ["copy"]
temperatures = [0.0]
seeds = [0]
""")
    run_dir = tmp / "run"
    code = main(["regress", "--config", str(tmp / "engine.toml"), "--run-dir", str(run_dir), "--no-tracking",
                 "--no-progress"])
    assert code in (0, 1) and (run_dir / "summary.json").exists()
    return run_dir


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    spec = EngineSpec(name="live", launch=tuple(server_args("ngram")), model="smollm2-135m", health_timeout_s=120)
    with EngineServer(spec, log_dir=tmp_path_factory.mktemp("live")) as server:
        yield server


@pytest.fixture(scope="module")
def recorded(engine) -> tuple[np.ndarray, np.ndarray]:
    """Per-request counter differences of 96 copy requests in random order, read through watch's
    own scraper and counter arithmetic."""
    scraper, rng = Scraper(engine.base_url), random.Random(0)
    before = scraper.first()
    acc, drafted = [], []
    for _ in range(96):
        ask(engine.base_url, rng.choice(COPY))
        time.sleep(0.05)  # llama.cpp folds a request into its counters when it frees the slot
        after = scraper.read()
        d = counter_delta(before, after)
        acc.append(d.accepted)
        drafted.append(d.drafted)
        before = after
    return np.array(acc), np.array(drafted)


def test_no_drift_replay_keeps_the_false_alarm_rate_promised(reference, recorded):
    ref = live_reference.load(str(reference))
    a, n = recorded
    live = a.sum() / n.sum()
    print(f"\nreference {ref.ratio:.3f} [{ref.low:.3f}, {ref.high:.3f}] φ {ref.dispersion:.2f} (upper {ref.dispersion_upper:.2f}) over {ref.requests} "
          f"requests; live {live:.3f} over {n.sum():.0f} drafted in {n.size} requests (φ {dispersion(a, n):.2f})")
    assert ref.low <= live <= ref.high or abs(live - ref.ratio) < 0.1, "the same traffic: acceptance should agree"
    arl_steps, min_drafted, max_steps = 100, 64, 1500
    results = {}
    # At p0 = the live acceptance itself (the hardest in-control case) and at the boundary the
    # reference sets: the measured ARL in detector steps against the one set.
    for name, p0 in (("at its own acceptance", live), ("at the reference boundary", ref.boundary())):
        d = design(p0, 0.10, min_drafted, ref.dispersion_upper, arl_steps)  # as watch sets it
        steps = replay_scrapes(a, n, d, runs=400, max_steps=max_steps, rng=1)
        results[name] = mean_run_length(steps, max_steps)
        print(f"ARL set {arl_steps} steps (exact {d.arl:.0f}); measured {results[name]:.0f} {name} (p0 {p0:.3f}, "
              f"h {d.h:.2f})")
    assert results["at its own acceptance"] >= 0.9 * arl_steps
    assert results["at the reference boundary"] >= arl_steps


def watch_cmd(engine_url: str, reference: Path, tmp: Path, *extra: str, port: int | None = None) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "watch", "--engine", engine_url, "--reference", str(reference),
            "--interval", "0.25", "--min-drafted", "48", "--listen", f"127.0.0.1:{port or free_port()}",
            "--log", str(tmp / "watch.jsonl"), *extra]


def watch_metrics(port: int, wait_s: float = 60) -> str:
    """watch's own /metrics, once it serves them (after its first scrape of the engine)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            time.sleep(0.2)
    return ""


def traffic(base_url: str, prompts_at, stop: threading.Event) -> threading.Thread:
    def loop():
        rng = random.Random(1)
        while not stop.is_set():
            try:
                ask(base_url, rng.choice(prompts_at()))
            except httpx.HTTPError:
                time.sleep(0.2)  # the engine restarting
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_injected_drift_is_raised_with_the_evidence(reference, engine, tmp_path):
    """Copy traffic for 20 s, then lists of numbers and short answers until the alarm."""
    phase = {"prompts": COPY}
    stop = threading.Event()
    hook_out = tmp_path / "hook.json"
    proc = subprocess.Popen(watch_cmd(engine.base_url, reference, tmp_path, "--arl-hours", "24", "--max-duration", "420",
                                      "--exit-on-alarm",
                                      "--on-alarm-command", f"{sys.executable} -c \"import sys; open({str(hook_out)!r}, 'w').write(sys.stdin.read())\""),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    t = traffic(engine.base_url, lambda: phase["prompts"], stop)
    try:
        time.sleep(20)
        assert proc.poll() is None, proc.communicate()
        switch_at = Scraper(engine.base_url).first()
        switched = time.monotonic()
        phase["prompts"] = DRIFT
        out, err = proc.communicate(timeout=410)
        alarmed = time.monotonic()
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        t.join(timeout=130)
    assert proc.returncode == 4, (out, err)
    line = [x for x in out.splitlines() if "ALARM" in x]
    assert len(line) == 1 and "nothing was switched off" in line[0] and "CUSUM" in line[0], out
    log = [json.loads(x) for x in (tmp_path / "watch.jsonl").read_text().splitlines()]
    drafted_needed = log[-1]["drafted"] - switch_at.drafted
    print(f"\ndrift raised {alarmed - switched:.1f} s and {drafted_needed:.0f} drafted tokens after the switch "
          f"(ARL set 24 h at 0.25 s a step); {line[0]}")
    assert drafted_needed > 0
    evidence = json.loads(hook_out.read_text())
    assert evidence["statistic"] >= evidence["threshold"] and evidence["labels"]["team"] == "inference-platform"


def test_restart_mid_watch_neither_alarms_nor_loses_drafted_tokens(reference, tmp_path):
    port = str(free_port())
    url = f"http://127.0.0.1:{port}"

    def start():
        p = subprocess.Popen(server_args("ngram", port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return p
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        p.kill()
        raise AssertionError("llama-server did not become healthy")

    server = start()
    stop = threading.Event()
    listen = free_port()
    proc = subprocess.Popen(watch_cmd(url, reference, tmp_path, "--arl-hours", "24", "--max-duration", "45", port=listen),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert watch_metrics(listen), "watch did not start"  # its first scrape is behind it: no traffic missed
        t = traffic(url, lambda: COPY, stop)
        time.sleep(12)
        stop.set()
        t.join(timeout=130)
        time.sleep(1.5)  # watch's last scrapes of the first epoch
        first_epoch = Scraper(url).first().drafted
        server.terminate()
        server.wait(timeout=30)
        server = start()
        stop.clear()
        t = traffic(url, lambda: COPY, stop)
        time.sleep(12)
        stop.set()
        t.join(timeout=130)
        time.sleep(1.5)
        second_epoch = Scraper(url).first().drafted
        out, err = proc.communicate(timeout=60)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        server.terminate()
        server.wait(timeout=30)
    assert proc.returncode == 0, (out, err)
    assert "restarted" in out and "ALARM" not in out
    log = [json.loads(x) for x in (tmp_path / "watch.jsonl").read_text().splitlines()]
    assert sum(r["restarted"] for r in log) == 1
    assert first_epoch > 0 and second_epoch > 0
    # Every drafted token of both epochs reached the detector (watch began before any traffic).
    assert sum(r["d_drafted"] for r in log) == first_epoch + second_epoch


def test_bad_input_exits_2_with_one_line(reference, tmp_path, capsys):
    no_metrics = server_args("plain")
    no_metrics.remove("--metrics")
    with EngineServer(EngineSpec(name="nometrics", launch=tuple(no_metrics), health_timeout_s=120), log_dir=tmp_path) as s:
        assert main(["watch", "--engine", s.base_url, "--reference", str(reference), "--max-duration", "1"]) == 2
    assert "needs --metrics" in capsys.readouterr().err
    assert main(["watch", "--engine", "http://127.0.0.1:9", "--reference", str(reference), "--candidate",
                 "plain-again", "--max-duration", "1"]) == 2
    err = capsys.readouterr().err
    assert "has no acceptance" in err and len(err.strip().splitlines()) == 1
    assert main(["export-monitoring", str(reference), "--out", str(tmp_path / "m"), "--candidate", "plain-again"]) == 2


def test_exported_rules_pass_promtool_and_the_dashboard_names_real_metrics(reference, engine, tmp_path):
    out = tmp_path / "monitoring"
    assert main(["export-monitoring", str(reference), "--out", str(out)]) == 0
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `apt-get install -y prometheus` (make setup does)"
    check = subprocess.run([promtool, "check", "rules", str(out / "decodegate-rules.yml")], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 6 rules found" in check.stdout, check.stdout + check.stderr
    ref = live_reference.load(str(reference))
    rules = (out / "decodegate-rules.yml").read_text()
    assert f"{ref.boundary():.4g}" in rules and "severity: critical" in rules and "runbook" in rules
    # A real scrape of the engine and of watch's own /metrics.
    exported = set(httpx.get(engine.base_url + "/metrics").text.split())
    port = free_port()
    proc = subprocess.Popen(watch_cmd(engine.base_url, reference, tmp_path, "--max-duration", "8", port=port),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    watch_text = watch_metrics(port)
    proc.communicate(timeout=60)
    names = {line.split("{")[0].split()[0] for text in (watch_text, " \n".join(exported)) for line in text.splitlines()
             if line and not line.startswith("#")}
    # Every watch series carries the run's labels.
    for line in watch_text.splitlines():
        if line.startswith("decodegate_"):
            assert 'team="inference-platform"' in line and 'chargeback="llm-serving"' in line and 'optimization="ngram"' in line
    dash = json.loads((out / "decodegate-dashboard.json").read_text())
    assert {v["name"] for v in dash["templating"]["list"]} >= {"engine"}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) == 5 and exprs
    for expr in exprs:
        used = metric_names(expr)
        assert used and used <= names, (expr, used - names)


PROMQL_WORDS = {"sum", "max", "min", "avg", "rate", "increase", "histogram_quantile", "by", "without", "and", "or",
                "unless", "sqrt", "label_values"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers, ranges,
    strings and `by (...)` lists that are not functions or keywords."""
    bare = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]|\bby\s*\([^)]*\)', " ", expr)
    words = re.findall(r"(?<![$\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", bare)
    return {w for w in words if w not in PROMQL_WORDS}


def test_an_mlflow_run_is_a_reference_too(reference, tmp_path, capsys):
    """The run synced to MLflow (sqlite store) and read back as mlflow:RUN_ID: the same rules."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["sync", str(reference), "--tracking-uri", uri]) == 0
    parent = re.search(r"under parent (\w+)", capsys.readouterr().out).group(1)
    assert main(["export-monitoring", f"mlflow:{parent}", "--tracking-uri", uri, "--out", str(tmp_path / "m")]) == 0
    assert main(["export-monitoring", str(reference), "--out", str(tmp_path / "f")]) == 0
    from_mlflow, from_folder = (json.dumps(yaml.safe_load((tmp_path / d / "decodegate-rules.yml").read_text()))
                                for d in ("m", "f"))
    assert from_mlflow.replace(f"mlflow:{parent}", str(reference)) == from_folder
    assert main(["export-monitoring", "mlflow:0123456789abcdef", "--tracking-uri", uri, "--out", str(tmp_path / "x")]) == 2
    assert "cannot fetch summary.json" in capsys.readouterr().err
