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

FORMAT = 1  # bump when the meaning of a stored row changes


def _weights(model) -> str:
    """Every float tensor (decoders.exit_heads.model_fingerprint) plus the integer weights and
    scales of quantized modules, which a state dict keeps out of sight in packed params."""
    cached = getattr(model, "_decodegate_weights_fp", None)
    if cached is not None:
        return cached
    from decoders.exit_heads import model_fingerprint
    h = hashlib.sha256(model_fingerprint(model).encode())
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


def model_fingerprint(loaded) -> str:
    """A loaded target or draft: its weights (quantized ones included) and its tokenizer."""
    cached = getattr(loaded, "_decodegate_fp", None)
    if cached is None:
        cached = hashlib.sha256(f"{_weights(loaded.model)}:{tokenizer_fingerprint(loaded.tokenizer)}".encode()
                                ).hexdigest()[:16]
        loaded._decodegate_fp = cached
    return cached


def file_digest(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime) in the user cache: a GGUF is hashed once."""
    from harness.models import cache_dir
    path = Path(path).resolve()
    st = path.stat()
    memo_path = cache_dir() / "file_digests.json"
    ident = f"{path}:{st.st_size}:{st.st_mtime_ns}"
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


def engine_fingerprint(server) -> dict:
    """What an engine run depends on: the engine build, its launch flags (the port left out) and
    the model file it serves, hashed; for an engine given by URL, what it reports about itself."""
    info = server.info or {}
    launch = list(getattr(server.spec, "launch", None) or ())   # the template: {port}, not the port
    command = list(getattr(server, "command", None) or ())
    # Every file the resolved command names (the binary, the model, a draft model), by content.
    files = {Path(a).name: file_digest(Path(a)) for a in command if Path(a).is_file()}
    model_file = (info.get("props") or {}).get("model_path")
    if model_file and Path(model_file).is_file():
        files.setdefault(Path(model_file).name, file_digest(Path(model_file)))
    return {"engine": info.get("engine"), "version": info.get("version"), "launch": launch,
            "models": info.get("models"), "files": files}


def code_fingerprint(decoder) -> str:
    """The source of the decoder's own module and of what every in-process decoder shares
    (sampling, cache, contract): a fix to the baseline decoder invalidates what it made before."""
    import inspect
    import decoders
    root = Path(decoders.__file__).parent
    files = {Path(inspect.getfile(type(decoder))).resolve()}
    files |= {root / n for n in ("base.py", "common.py", "sampling.py")}
    h = hashlib.sha256()
    for f in sorted(files):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def _processor(device) -> str:
    """Which chip computes: kernels (and so near-tie outcomes) differ between GPU models and
    between CPU vector units, so a baseline is reused only on the same kind of processor."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def environment(device) -> dict:
    import transformers
    return {"device": str(device), "processor": _processor(device), "torch": torch.__version__,
            "transformers": transformers.__version__}
