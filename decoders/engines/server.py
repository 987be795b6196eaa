"""One serving engine as a process decodegate can talk to: already running (`base_url`) or
launched by decodegate (`launch`), health-checked, and always stopped.

What this module does: pick a free port, start the launch command with its output in a log
file, wait (bounded) until `/health` answers, read what the engine says about itself (served
model names, version), scrape its Prometheus `/metrics`, and stop it: on a normal exit, on
Ctrl-C, on an exception, and (through PR_SET_PDEATHSIG) when decodegate itself is killed.

What it does not do: speak a generation protocol. The flavours (`llamacpp`, `openai_compat`,
`sglang`) do that, through `decoders.engines.client`.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from decoders.base import DecoderError


class EngineError(DecoderError):
    """An engine that cannot be used as configured: unreachable, another model, missing flags."""


class EngineDown(EngineError):
    """An engine that stopped answering in the middle of a run (after bounded retries)."""


@dataclass(frozen=True)
class EngineSpec:
    name: str
    base_url: str | None = None                 # an engine already running
    launch: tuple[str, ...] | None = None       # or a command decodegate starts; {port} is filled in
    model: str | None = None                    # the model name the engine must serve (checked)
    health_timeout_s: float = 300.0             # launch: how long to wait for /health
    request_timeout_s: float = 300.0            # one request, streaming included
    retries: int = 2                            # per request, on connection errors and timeouts
    concurrency: int = 1                        # requests in flight at once
    api_key: str | None = None                  # sent as a bearer token (OpenAI routes)
    env: dict = field(default_factory=dict)     # extra environment for the launched process
    reuse_baseline: bool = False                # base_url: its rows may come from the baseline store


# What a signal that ended an engine usually means, for the one line a user reads.
_SIGNAL_CAUSE = {
    "SIGILL": "built for a CPU feature this machine cannot run: rebuild it on this machine",
    "SIGSEGV": "a crash in the engine's native code",
    "SIGBUS": "a crash in the engine's native code (a bad memory mapping)",
    "SIGABRT": "the engine aborted (an assertion or an uncaught exception; see its log)",
    "SIGKILL": "killed from outside, most often by the kernel's out-of-memory killer (see `dmesg`)",
}


def exit_cause(returncode: int) -> str:
    """How a process ended, in words: "exited with code 3", or "died from SIGILL (built for a CPU
    feature this machine cannot run ...)". Popen gives a signal as a negative return code."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"died from signal {-returncode}"
    cause = _SIGNAL_CAUSE.get(name)
    return f"died from {name}" + (f" ({cause})" if cause else "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: if decodegate dies (even by SIGKILL), the engine gets
    # SIGTERM instead of living on as an orphan holding a port and a model in memory.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EngineServer:
    """`with EngineServer(spec, log_dir) as server:` starts (or checks) the engine and stops it."""

    def __init__(self, spec: EngineSpec, log_dir: Path | None = None):
        if not spec.base_url and not spec.launch:
            raise EngineError(f"engine {spec.name!r}: give base_url (a running engine) or launch (a command)")
        self.spec = spec
        self.log_dir = Path(log_dir) if log_dir else None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.base_url = (spec.base_url or "").rstrip("/")
        self.command: list[str] = []
        self.info: dict = {}
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        """One client for the engine's life (httpx's clients may be shared between threads).
        A module-level `httpx.post` builds a client per call, and with it an SSL context that
        loads the system's CA certificates: 20 ms a request on this machine, twice the engine's
        own time for the one-position requests of the `engine:NAME` reference (1,500 of them in
        one test run)."""
        if self._http is None:
            self._http = httpx.Client()
        return self._http

    # ------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "EngineServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start a launched engine's process and return at once: several engines that do not
        depend on each other boot together (`wait_ready` then waits for each). A no-op for an
        engine given by URL."""
        if not self.spec.launch:
            return
        port = free_port()
        self.command = [a.replace("{port}", str(port)) for a in self.spec.launch]
        self.base_url = f"http://127.0.0.1:{port}"
        log_dir = self.log_dir or Path.cwd()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"engine-{self.spec.name}.log"
        log = open(self.log_path, "ab")
        log.write(f"$ {' '.join(self.command)}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.spec.env},
                                         start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as e:
            raise EngineError(f"engine {self.spec.name!r}: cannot start {self.command[0]!r}: {e}") from e
        finally:
            log.close()
        self._launched_at = time.monotonic()

    def wait_ready(self) -> None:
        """Healthy, described, serving the configured model; a launched engine that is not is stopped."""
        if self.spec.launch:
            if self.proc is None:
                self.launch()
            try:
                self._wait_healthy(deadline=self._launched_at + self.spec.health_timeout_s)
            except BaseException:
                self.stop()
                raise
        else:
            # A server that answers (503 while it loads a model) gets 10 s; an address where
            # nothing listens is refused in 2: a wrong base_url should not cost a user's wait.
            now = time.monotonic()
            self._wait_healthy(deadline=now + min(self.spec.health_timeout_s, 10.0),
                               refused_deadline=now + min(self.spec.health_timeout_s, 2.0))
        self.info = self.describe()
        self._check_model()

    def terminate(self) -> None:
        """SIGTERM to a launched engine's process group, without waiting (stop waits)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to a launched engine's process group, at once: what is left when a second
        interrupt cuts a stop short (an engine that ignores SIGTERM would live on)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def exit_state(self) -> str:
        """"its process died from SIGSEGV (...)" once a launched engine has ended, else ""."""
        if self.proc is None or self.proc.poll() is None:
            return ""
        return f"its process {exit_cause(self.proc.returncode)}"

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join("    " + t for t in text)

    def _wait_healthy(self, deadline: float, refused_deadline: float | None = None) -> None:
        last, answered = "no answer", False
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineError(f"engine {self.spec.name!r}: {self.command[0]} {exit_cause(self.proc.returncode)} "
                                  f"before it became healthy; log {self.log_path}:\n{self.log_tail()}")
            try:
                r = self.http.get(self.base_url + "/health", timeout=5.0, headers=self.headers())
                if r.status_code == 200:
                    return
                last, answered = f"HTTP {r.status_code} {r.text[:200]!r}", True
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            now = time.monotonic()
            if now > deadline or (not answered and refused_deadline is not None and now > refused_deadline):
                where = (f"; log {self.log_path}:\n{self.log_tail()}" if self.proc is not None
                         else " (is the engine running? check base_url)")
                raise EngineError(f"engine {self.spec.name!r} at {self.base_url} is not healthy ({last}){where}")
            time.sleep(0.5)

    # ---------------------------------------------------------------------------- what it says

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}

    def get_json(self, path: str, timeout: float = 10.0):
        r = self.http.get(self.base_url + path, timeout=timeout, headers=self.headers())
        r.raise_for_status()
        return r.json()

    def post_json(self, path: str, body: dict, timeout: float = 30.0):
        r = self.http.post(self.base_url + path, json=body, timeout=timeout, headers=self.headers())
        r.raise_for_status()
        return r.json()

    def describe(self) -> dict:
        """Served model names, version and launch flags, best effort across engines."""
        info: dict = {"name": self.spec.name, "base_url": self.base_url, "launch": list(self.command) or None}
        try:
            listed = self.get_json("/v1/models").get("data", [])
            info["models"] = [m.get("id") for m in listed]
        except (httpx.HTTPError, ValueError, AttributeError):
            listed, info["models"] = [], []
        for path, key in (("/props", "build_info"), ("/version", "version"), ("/get_server_info", "version")):
            try:
                body = self.get_json(path)
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(body, dict) and body.get(key):
                info["version"] = str(body[key])
                if path == "/props":
                    info["engine"] = "llama.cpp"
                    info["props"] = {k: body.get(k) for k in ("model_path", "total_slots")}
                    params = (body.get("default_generation_settings") or {}).get("params") or {}
                    info["speculative"] = {k: v for k, v in params.items() if k.startswith("speculative.")}
                break
        if any(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in listed):
            info.update(vllm_facts(self.command, self.metrics()))
        return info

    def _check_model(self) -> None:
        want, served = self.spec.model, self.info.get("models") or []
        if want and served and want not in served:
            raise EngineError(f"engine {self.spec.name!r} at {self.base_url} serves {', '.join(map(str, served))}, "
                              f"but the config expects model {want!r}")

    @property
    def served_model(self) -> str:
        """The name to put in OpenAI requests' `model` field."""
        return self.spec.model or (self.info.get("models") or ["default"])[0]

    def metrics(self) -> dict[str, float] | None:
        """Prometheus counters as {'name{label="v"}': value}; None when /metrics is not served."""
        from decoders.engines.telemetry import flatten
        try:
            r = self.http.get(self.base_url + "/metrics", timeout=10.0, headers=self.headers())
        except httpx.HTTPError:
            return None
        return flatten(r.text) if r.status_code == 200 else None


def vllm_facts(command: list[str], metrics: dict[str, float] | None) -> dict:
    """What a record needs to know about a vLLM server beyond its version: its speculative
    config (the launch command's `--speculative-config`; for a server decodegate did not start,
    only whether /metrics has spec-decode counters) and whether prefix caching is on (an A/A run
    on the same server then hits the prompts the baseline just cached, and reads faster)."""
    import json
    facts: dict = {"engine": "vLLM"}
    flag = next((i for i, a in enumerate(command) if a.split("=", 1)[0] in ("--speculative-config",
                                                                            "--speculative_config")), None)
    if flag is not None and ("=" in command[flag] or flag + 1 < len(command)):
        raw = command[flag].split("=", 1)[1] if "=" in command[flag] else command[flag + 1]
        try:
            facts["speculative"] = json.loads(raw)
        except ValueError:
            facts["speculative"] = raw
    elif metrics is not None:
        drafting = any(k.split("{", 1)[0] == "vllm:spec_decode_num_drafts_total" for k in metrics)
        facts["speculative"] = ({"method": "not reported (spec-decode counters present)"} if drafting else None)
    for key in (metrics or {}):
        if key.startswith("vllm:cache_config_info{"):
            facts["prefix_caching"] = 'enable_prefix_caching="True"' in key
    return facts
