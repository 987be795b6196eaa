"""An engine candidate whose server stops answering is stopped at its time limit and named as hung
in the same run; the baseline and the other candidates are judged, and regress exits 1 with a
verdict. Engine decoders are HTTP clients in decodegate's own process, so this bound is the
client's (it cancels its requests), not a worker's kill; the watchdog stays as the backstop.

The hang is a proxy in front of a real llama.cpp: every route passes through (health, props,
tokenize, metrics), but each generation request (`/completion`) is held unanswered, as a wedged
server holds it."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from harness.cli import main
from test_engines import engine_config, launch_args, write_suite

pytestmark = pytest.mark.usefixtures("llama_server")


class Wedged(BaseHTTPRequestHandler):
    upstream = ""
    release = threading.Event()
    held = 0
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        self._forward(None)

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/completion":
            return self._forward(body)
        type(self).held += 1
        self.release.wait(300)
        self.close_connection = True

    def _forward(self, body: bytes | None) -> None:
        r = httpx.request(self.command, self.upstream + self.path, content=body, timeout=60,
                          headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)


@pytest.fixture
def wedged(tmp_path):
    from decoders.engines.server import EngineServer, EngineSpec
    spec = EngineSpec(name="real", launch=tuple(launch_args("-np", "1", "--spec-type", "none")),
                      model="smollm2-135m", health_timeout_s=120)
    with EngineServer(spec, log_dir=tmp_path / "real-log") as real:
        Wedged.upstream, Wedged.held = real.base_url, 0
        Wedged.release.clear()
        proxy = ThreadingHTTPServer(("127.0.0.1", 0), Wedged)
        proxy.daemon_threads = True
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{proxy.server_port}"
        finally:
            Wedged.release.set()
            proxy.shutdown()
            proxy.server_close()


@pytest.mark.slow
def test_a_wedged_engine_candidate_is_stopped_as_hung_and_the_run_ends_with_a_verdict(tmp_path, wedged, capsys):
    suite = write_suite(tmp_path)
    cfg = engine_config(tmp_path, suite, {"plain": launch_args("-np", "1", "--spec-type", "none")},
                        [("aa", "plain"), ("wedged", "stuck")])
    text = cfg.read_text().replace("[baseline]", f'[engines.stuck]\nbase_url = "{wedged}"\nmodel = "smollm2-135m"\n\n'
                                                  f"[baseline]", 1)
    cfg.write_text(text)
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress",
                 "--item-timeout", "4"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert Wedged.held >= 1, "the proxy never held a generation request: the test tested nothing"
    # A verdict was written (the watchdog's exit would leave none), and it fails the wedged one.
    assert code == 1, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    wedged_c, aa = summary["candidates"]["wedged"], summary["candidates"]["aa"]
    assert wedged_c["verdict"] == "fail", wedged_c
    failed = {g["name"]: g["detail"] for g in wedged_c["gates"] if g["status"] == "fail"}
    assert "hung on mini/" in failed.get("hung", ""), failed
    stops = [json.loads(x) for x in (run_dir / "stops.jsonl").read_text().splitlines() if x.strip()]
    [stop] = [s for s in stops if s["candidate"] == "wedged"]
    assert stop["reason"] == "hung" and "no result after" in stop["detail"] and "cancelled" in stop["detail"], stop
    assert "wedged: hung on mini/" in err
    # The others were judged in this same run.
    assert aa["suites"]["mini"]["identity"]["T=0"]["identical"] == 4, aa
    # Bounded by the item limit (4 s per item of its block), not by the watchdog's grace or the
    # request timeout: the run does not wait out the wedged server.
    assert took < 600, took
