"""Content fingerprints: what a model, a tokenizer, an engine and a decoder *are*, not their names.

A baseline row may be reused, and a run resumed, only where every fingerprint matches: a new
tokenizer, a fine-tuned checkpoint under the old name, a requantized GGUF or an edited decoder
changes the hash, and nothing made before is taken for it (the essay's "re-check after every
tokenizer or fine-tuning change", made automatic).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

FORMAT = 2  # bump when the meaning of a stored row changes


def _weights(model) -> str:
    """Every float tensor (decoders.exit_heads.model_fingerprint), the buffers a state dict does not
    keep, and the integer weights and scales of quantized modules, which a state dict keeps out
    of sight in packed params."""
    cached = getattr(model, "_decodegate_weights_fp", None)
    if cached is not None:
        return cached
    from decoders.exit_heads import model_fingerprint
    h = hashlib.sha256(model_fingerprint(model).encode())
    # Buffers a state dict leaves out (non-persistent ones: rotary inv_freq, ...) shape the output too.
    saved = set(model.state_dict())
    for name, buf in model.named_buffers():
        if name not in saved and isinstance(buf, torch.Tensor):
            h.update(name.encode() + str(buf.dtype).encode())
            h.update(buf.detach().to("cpu", torch.float64 if buf.is_floating_point() else torch.int64)
                     .contiguous().numpy().tobytes())
    for name, mod in model.named_modules():
        weight = getattr(mod, "weight", None)
        if "_packed_params" in mod._modules or hasattr(mod, "_packed_params"):
            w = mod.weight() if callable(weight) else weight
            if isinstance(w, torch.Tensor) and w.is_quantized:
                h.update(name.encode() + str(w.dtype).encode())
                h.update(w.int_repr().contiguous().numpy().tobytes())
                scales = w.q_per_channel_scales() if w.qscheme() in (torch.per_channel_affine,
                                                                      torch.per_channel_symmetric) \
                    else torch.tensor([w.q_scale()])
                h.update(scales.to(torch.float64).numpy().tobytes())
    out = h.hexdigest()[:16]
    try:
        model._decodegate_weights_fp = out
    except AttributeError:  # pragma: no cover
        pass
    return out


def tokenizer_fingerprint(tok) -> str:
    """The vocabulary, merges are implied by the backend's serialization, special tokens, template."""
    parts = [type(tok).__name__, getattr(tok, "chat_template", None) or "",
             json.dumps(getattr(tok, "special_tokens_map", {}), sort_keys=True, default=str)]
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        parts.append(backend.to_str())
    else:
        parts.append(json.dumps(sorted(tok.get_vocab().items())))
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def config_fingerprint(model) -> str:
    """The model's config (rope_theta, rope_scaling, sliding window, attention implementation, ...)
    and generation config: fields that change the output without touching a weight. Where the
    model was loaded from is left out, and the transformers version is keyed on its own."""
    drop = {"_name_or_path", "_commit_hash", "transformers_version"}
    parts = []
    for cfg in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        if cfg is not None and hasattr(cfg, "to_dict"):
            parts.append({k: v for k, v in cfg.to_dict().items() if k not in drop})
    # to_dict() leaves the attention implementation out; it picks the kernels (the lean path runs
    # under sdpa only), so it is keyed on its own.
    parts.append(getattr(getattr(model, "config", None), "_attn_implementation", None))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_fingerprint(loaded) -> str:
    """A loaded target or draft: its weights (quantized ones and buffers included), its config and
    its tokenizer."""
    cached = getattr(loaded, "_decodegate_fp", None)
    if cached is None:
        cached = hashlib.sha256(f"{_weights(loaded.model)}:{config_fingerprint(loaded.model)}:"
                                f"{tokenizer_fingerprint(loaded.tokenizer)}".encode()).hexdigest()[:16]
        loaded._decodegate_fp = cached
    return cached


def file_digest(path: Path) -> str:
    """sha256 of a file, remembered in the user cache by path, size, mtime, inode and ctime: a GGUF
    is hashed once. The mtime alone is not enough: `cp -p`, `rsync -a` and reproducible builds keep
    it across new content of the same size; a write or a rename in place always moves the ctime,
    which no tool can set back."""
    from harness.models import cache_dir
    path = Path(path).resolve()
    st = path.stat()
    memo_path = cache_dir() / "file_digests.json"
    ident = f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if ident not in memo:
        with open(path, "rb") as f:
            memo[ident] = hashlib.file_digest(f, "sha256").hexdigest()[:16]
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, memo_path)
        except OSError:
            pass  # a read-only cache costs a re-hash next time, nothing else
    return memo[ident]


# Environment variables a launched engine reads as flags or device choices (llama.cpp's LLAMA_ARG_*
# set any flag; vLLM and SGLang read their own; the visible devices pick the GPU).
ENGINE_ENV_PREFIXES = ("LLAMA_ARG_", "GGML_", "VLLM_", "SGLANG_", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                       "ROCR_VISIBLE_DEVICES")


def _named_files(args) -> dict:
    """Every file an argument names, `PATH` or `--flag=PATH`, by its full path, with its digest."""
    files = {}
    for a in args:
        for candidate in (a, a.split("=", 1)[1] if a.startswith("-") and "=" in a else None):
            if candidate and Path(candidate).is_file():
                path = Path(candidate).resolve()
                files[str(path)] = file_digest(path)
    return files


def launch_environment(spec) -> dict:
    """The environment the engine was launched with, as far as it can change the output: the
    spec's `env`, and the engine variables it inherits from ours."""
    inherited = {k: v for k, v in os.environ.items() if k.startswith(ENGINE_ENV_PREFIXES)}
    return dict(sorted({**inherited, **(getattr(spec, "env", None) or {})}.items()))


def host_processors() -> dict:
    """The CPU model and the GPUs this machine shows: where a launched engine computes."""
    gpus = []
    try:
        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except RuntimeError:  # pragma: no cover - a driver that answers with an error
        gpus = ["unknown"]
    return {"cpu": _processor("cpu"), "gpus": gpus}


def engine_fingerprint(server) -> dict:
    """What an engine run depends on: the engine build, its launch flags (the port left out), its
    launch environment, the processors of this machine, and every file the command names, by full
    path and content; for an engine given by URL, only what it reports about itself (which does
    not identify a deployment: see harness.run.reuse)."""
    info = server.info or {}
    spec = server.spec
    launch = list(getattr(spec, "launch", None) or ())   # the template: {port}, not the port
    command = list(getattr(server, "command", None) or ())
    files = _named_files(command)
    model_file = (info.get("props") or {}).get("model_path")
    if model_file:
        files.update(_named_files([model_file]))
    out = {"engine": info.get("engine"), "version": info.get("version"), "launch": launch,
           "models": info.get("models"), "files": dict(sorted(files.items()))}
    if launch:
        out.update(env=launch_environment(spec), processor=host_processors())
    else:
        out.update(base_url=getattr(server, "base_url", None) or getattr(spec, "base_url", None))
    return out


def _engines_dir() -> Path:
    import decoders.engines
    return Path(decoders.engines.__file__).resolve().parent


ENGINE_CLIENT_DIR = _engines_dir()   # where the client's modules are read from (a test points it at an edited copy)


def engine_client_fingerprint(decoder_class) -> str:
    """The source of the code that builds an engine's requests and reads its answers: every module
    of decoders/engines/, the decoder contract, and the decoder class's own file where it lives
    elsewhere. A fix to how a request is built invalidates the rows built the old way."""
    import inspect
    import decoders
    files = {f"engines/{f.name}": f for f in sorted(Path(ENGINE_CLIENT_DIR).glob("*.py"))}
    files["base.py"] = Path(decoders.__file__).parent / "base.py"
    own = Path(inspect.getfile(decoder_class)).resolve()
    if own.parent != _engines_dir():
        files[f"class/{own.name}"] = own
    h = hashlib.sha256()
    for name, f in sorted(files.items()):
        if f.is_file():
            h.update(name.encode() + b"\x00" + f.read_bytes())
    return h.hexdigest()[:16]


def _imported_sources(path: Path, root: Path) -> set[Path]:
    """`path` and every module of the decoders package it imports, transitively (imports inside
    functions too), with the native source a module builds beside it (panel.py's panel.c)."""
    import ast
    seen: set[Path] = set()
    todo = [path.resolve()]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        native = f.with_suffix(".c")
        if native.is_file():
            seen.add(native)
        package = f.parent if root in f.parents or f.parent == root else None
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level and package is not None:
                    base = package
                    for _ in range(node.level - 1):
                        base = base.parent
                    mod = ".".join(base.relative_to(root.parent).parts + ((node.module,) if node.module else ()))
                elif node.level:
                    continue
                else:
                    mod = node.module or ""
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]   # `from decoders import panel`
            for name in names:
                parts = name.split(".")
                if parts[0] != root.name:
                    continue
                where = root.parent.joinpath(*parts)
                todo += [where.with_suffix(".py"), where / "__init__.py"]
    return seen


DECODERS_DIR = ENGINE_CLIENT_DIR.parent   # where the decoders' modules are read from (a test points it at an edited copy)


def code_fingerprint(decoder) -> str:
    """The source of every module the decoder runs: its own, and every module of decoders/ that it
    imports, transitively (the cache, the lean forward, the panel kernel's C source and what every
    decoder shares). A fix anywhere on the path that made a baseline row invalidates that row; a
    change to a decoder the baseline does not run does not."""
    import inspect
    root = Path(DECODERS_DIR).resolve()
    cls = decoder if isinstance(decoder, type) else type(decoder)  # a class: a decoder built in its worker
    own = Path(inspect.getfile(cls)).resolve()
    if _engines_dir().parent in own.parents:
        own = root / own.relative_to(_engines_dir().parent)
    files = _imported_sources(own, root) | _imported_sources(root / "base.py", root)
    h = hashlib.sha256()
    for f in sorted(files):
        name = f.relative_to(root) if root in f.parents else f.name
        h.update(str(name).encode() + b"\x00" + f.read_bytes())
    return h.hexdigest()[:16]


CPUINFO = Path("/proc/cpuinfo")
# The extensions a CPU's kernels dispatch on (MKL, oneDNN, ggml, decoders/panel.c): two chips that
# differ here run other kernels and can round differently. Other flags (hypervisor, microcode
# features) are left out, so identical hosts still share a store.
VECTOR_FLAGS = frozenset({
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",   # x86
    "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16", "sme"})                          # Arm


def _processor(device) -> str:
    """Which chip computes: kernels (and so near-tie outcomes) differ between GPU models and
    between CPU vector units, so a baseline is reused only on the same kind of processor. A
    virtual machine often shows one model name ("AMD EPYC") for several generations, so a CPU is
    named by vendor, family, model and vector extensions too (a Zen 2 without AVX-512 and a Zen
    5 with it share that name)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        fields: dict[str, str] = {}
        for line in CPUINFO.read_text().splitlines():
            key, sep, value = line.partition(":")
            if not sep:
                if fields:
                    break  # the first processor's block is enough: they are all alike
                continue
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        fields = {}
    name = fields.get("model name") or fields.get("Hardware") or ""
    kind = [fields[k] for k in ("vendor_id", "cpu family", "model", "CPU implementer", "CPU part") if k in fields]
    flags = sorted(VECTOR_FLAGS.intersection((fields.get("flags") or fields.get("Features") or "").split()))
    if not (name or kind or flags):
        import platform
        return platform.processor() or platform.machine()
    return f"{name} [{' '.join(kind)}; {' '.join(flags)}]"


def environment(device) -> dict:
    import transformers
    return {"device": str(device), "processor": _processor(device), "torch": torch.__version__,
            "transformers": transformers.__version__}
