"""Prove, at setup, that every native build the project made runs on this machine.

A native build that compiled is not yet a build that runs: llama.cpp compiled for the native CPU
once carried AMX kernels that trap with SIGILL on an Intel Xeon (docs/engines-and-load.md), and
the failure surfaced as 27 unrelated test failures. So `make setup` runs each build once, for
real, and a build that crashes, hangs or answers garbage fails the setup with one line: what
died, how (the signal, in words), and what to do.

    python -m harness.selfcheck            # llama-server and the panel kernel
    python -m harness.selfcheck llama-server

Each check runs in a child process (a SIGILL in the panel kernel would otherwise end this one).
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

from decoders.engines.server import EngineError, EngineServer, EngineSpec, exit_cause

REBUILD = "rebuild it: `rm -f .venv/.llama-server && make setup` (or set DECODEGATE_LLAMA_SERVER to a working one)"


class SetupError(RuntimeError):
    """A native build that does not run here; the message is one line (plus an optional log tail)."""


def prove_llama_server(timeout_s: float = 90.0) -> str:
    """Start the llama-server decodegate would use on the embedded model, ask for four greedy
    tokens with their probabilities, stop it. Returns a one-line summary; raises SetupError."""
    from harness.run.engines import gguf, llama_tool
    try:
        binary = llama_tool("llama-server")
        model = gguf("smollm2-135m")
    except Exception as e:  # noqa: BLE001 - not found / no model: the one line says which
        raise SetupError(f"llama-server: {e}") from None
    spec = EngineSpec(name="selfcheck", launch=(binary, "-m", model, "--host", "127.0.0.1", "--port", "{port}",
                                                "-t", "1", "-c", "256", "--spec-type", "none"),
                      health_timeout_s=timeout_s)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="decodegate-selfcheck-") as logs:
        server = EngineServer(spec, log_dir=Path(logs))
        try:
            server.start()
            body = server.post_json("/completion", {"prompt": "The capital of France is", "n_predict": 4,
                                                    "temperature": 0, "n_probs": 2, "return_tokens": True},
                                    timeout=timeout_s)
            _check_answer(body)
        except EngineError as e:
            raise SetupError(f"llama-server ({binary}): {_first_line(e)}; {REBUILD}\n{server.log_tail(8)}") from None
        except Exception as e:  # noqa: BLE001 - a request that failed: the process may have died under it
            state = server.exit_state() or f"{type(e).__name__}: {e}"
            raise SetupError(f"llama-server ({binary}): {state}; {REBUILD}\n{server.log_tail(8)}") from None
        finally:
            server.stop()
    return f"llama-server: ok, 4 tokens from {Path(model).name} in {time.monotonic() - t0:.1f} s ({binary})"


def _check_answer(body) -> None:
    """Four token ids, each with a finite log-probability: anything else is garbage."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    probs = body.get("completion_probabilities") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or len(tokens) != 4 or not all(isinstance(t, int) and t >= 0 for t in tokens):
        raise SetupError(f"answered without 4 token ids: {str(body)[:200]}")
    values = [p.get("logprob", p.get("prob")) for p in probs or [] if isinstance(p, dict)]
    if len(values) != 4 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise SetupError(f"answered without a finite probability per token: {str(probs)[:200]}")


def _first_line(e: Exception) -> str:
    """The error's first line, without the log path (the log is a temporary file; its tail follows)."""
    line = str(e).splitlines()[0] if str(e) else type(e).__name__
    return line.split("; log /", 1)[0]


# In the child: the build and the check against torch. One that fails is not fatal (decodegate then
# uses torch's products, as decoders.panel.kernel does); one that crashes would end decodegate.
PANEL_CHECK = """
import decoders.panel as p
try:
    p._self_check(p._load())
except (OSError, RuntimeError, AttributeError) as e:
    print(f"off ({e}); torch's products are used")
else:
    print("ok, agrees with torch")
"""


def prove_panel(timeout_s: float = 300.0) -> str:
    """Build the small-M kernel (-march=native) and run its check against torch, in a child."""
    try:
        done = subprocess.run([sys.executable, "-c", PANEL_CHECK], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SetupError(f"panel kernel: its build and check did not finish in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        raise SetupError(f"panel kernel (decoders/panel.c, -march=native): the check {exit_cause(done.returncode)}"
                         + (f": {last}" if last and done.returncode > 0 else "")
                         + "; decodegate would crash on first use: set DECODEGATE_PANEL=0 to use torch's products")
    return f"panel kernel: {done.stdout.strip()}"


CHECKS = {"llama-server": prove_llama_server, "panel": prove_panel}


@cache
def cached_llama_server_proof() -> str | None:
    """For the test suite's session fixture: None when the server works, else the one message."""
    try:
        prove_llama_server()
        return None
    except SetupError as e:
        return str(e)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.selfcheck", description=__doc__.split("\n\n")[0],
                                 epilog="exit 0 when every check passed, 1 when one failed (with one line each)")
    ap.add_argument("checks", nargs="*", metavar="CHECK",
                    help=f"what to prove: {', '.join(CHECKS)} (default: all)")
    args = ap.parse_args(argv)
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        ap.error(f"unknown check {unknown[0]!r}; choose from {', '.join(CHECKS)}")
    failed = 0
    for name in args.checks or list(CHECKS):
        try:
            print(f"decodegate setup: {CHECKS[name]()}", flush=True)
        except SetupError as e:
            print(f"decodegate setup: FAILED: {e}", file=sys.stderr, flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
