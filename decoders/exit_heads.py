"""Per-layer exit heads for early exit: small learned maps applied to an intermediate hidden
state before the model's final norm and LM head (tuned-lens style, Belrose et al. 2023).

Without exit heads, early exit reads an intermediate layer through the shared final norm and LM
head as they are (the logit lens). An exit head first translates the hidden state of that layer
towards the final layer's basis:

    logits_l = lm_head(norm(T_l(h_l))),   T_l(h) = h + h @ W_l.T + b_l        # residual affine

so an all-zero head is the identity and reproduces the logit lens exactly. Only the logits are
affected: state propagation still copies the raw hidden state h_l upward.

File format (a folder), version 1:

    exit_heads.json      {"format": "decodegate-exit-heads", "version": 1,
                          "hidden_size": H, "layers": [l, ...],      # exit layers, ascending
                          "model": "...", ...}                        # optional provenance keys
    layer_<l>.safetensors   tensors "weight" (H, H) and "bias" (H,), floating point

A layer index `l` counts layers run, as the early-exit stats do: the head for `l` reads the
hidden state after decoder layers 0 .. l-1, so 1 <= l < num_layers. The loader validates the
marker, version, hidden size, layer range and tensor shapes, and refuses non-finite values.

Provenance: `decodegate train-exits` (harness/exits/train.py) writes `target_fingerprint`
(`model_fingerprint`: architecture, output-shaping config and a hash of every weight), `target`, `num_layers`, the data
hash, steps and seed. Heads that carry a fingerprint are refused on any other model, naming
both. `save_exit_heads` writes into a temporary folder and renames it into place, so a folder
that has an exit_heads.json is always complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decoders.base import DecoderError

FORMAT = "decodegate-exit-heads"
VERSION = 1
INDEX = "exit_heads.json"


def layer_file(layer: int) -> str:
    return f"layer_{layer}.safetensors"


@dataclass(frozen=True)
class ExitHeads:
    """Loaded heads: layer -> (weight (H, H), bias (H,))."""

    hidden_size: int
    heads: Mapping[int, tuple[torch.Tensor, torch.Tensor]]
    source: str = ""
    meta: Mapping = field(default_factory=dict)   # exit_heads.json as read (provenance)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.heads))

    def apply(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """T_l(h) = h + h W^T + b on (..., H)."""
        weight, bias = self.heads[layer]
        return hidden + torch.nn.functional.linear(hidden, weight, bias)

    def to(self, device=None, dtype=None) -> ExitHeads:
        moved = {l: (w.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype))
                 for l, (w, b) in self.heads.items()}
        return ExitHeads(self.hidden_size, moved, self.source, self.meta)

    def check_fits(self, num_layers: int, hidden_size: int, *, fingerprint: str | None = None,
                   model_name: str = "this model") -> None:
        """Refuse heads made for another model: shape, and (when both sides have one) the
        target fingerprint written at training."""
        made_for = self.meta.get("target", "?")
        theirs = self.meta.get("target_fingerprint")
        if fingerprint is not None and theirs is not None and theirs != fingerprint:
            raise DecoderError(f"exit heads {self.source or ''} were trained for target {made_for!r} "
                               f"(fingerprint {theirs}), not for {model_name!r} (fingerprint {fingerprint}): "
                               f"train heads for this target with `decodegate train-exits`")
        n_theirs = self.meta.get("num_layers")
        if isinstance(n_theirs, int) and n_theirs != num_layers:
            raise DecoderError(f"exit heads {self.source or ''} were trained for {made_for!r} with {n_theirs} "
                               f"layers; {model_name!r} has {num_layers}")
        if self.hidden_size != hidden_size:
            raise DecoderError(f"exit heads {self.source or ''} (trained for {made_for!r}) have hidden_size "
                               f"{self.hidden_size}, but {model_name!r}'s is {hidden_size}")
        bad = [l for l in self.layers if not 1 <= l < num_layers]
        if bad:
            raise DecoderError(f"exit heads {self.source or ''} name layers {bad} outside [1, {num_layers}) "
                               f"for a model with {num_layers} layers")


def _check_pair(layer: int, weight: torch.Tensor, bias: torch.Tensor, hidden_size: int, where: str) -> None:
    if not (weight.is_floating_point() and bias.is_floating_point()):
        raise DecoderError(f"{where}: exit head for layer {layer} must hold floating-point tensors")
    if tuple(weight.shape) != (hidden_size, hidden_size):
        raise DecoderError(f"{where}: exit head for layer {layer} has weight of shape {tuple(weight.shape)}, "
                           f"expected ({hidden_size}, {hidden_size})")
    if tuple(bias.shape) != (hidden_size,):
        raise DecoderError(f"{where}: exit head for layer {layer} has bias of shape {tuple(bias.shape)}, "
                           f"expected ({hidden_size},)")
    if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise DecoderError(f"{where}: exit head for layer {layer} holds NaN or inf")


def _layer_list(value, where: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise DecoderError(f"{where}: 'layers' must be a non-empty list of integers, got {value!r}")
    if not all(isinstance(l, int) and not isinstance(l, bool) for l in value):
        raise DecoderError(f"{where}: 'layers' must hold integers, got {value!r}")
    if len(set(value)) != len(value):
        raise DecoderError(f"{where}: 'layers' lists a layer twice: {value!r}")
    return sorted(value)


def read_marked_json(path: Path, fmt: str) -> dict:
    """A JSON object whose 'format' key must be `fmt`; DecoderError naming the file otherwise."""
    try:
        meta = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DecoderError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise DecoderError(f"{path}: 'format' must be {fmt!r}")
    return meta


def load_exit_heads(folder, *, num_layers: int | None = None, hidden_size: int | None = None) -> ExitHeads:
    """Read and validate an exit-heads folder. With `num_layers` / `hidden_size`, also check that
    the heads fit that model. Errors are `DecoderError` naming the file and the problem."""
    from safetensors import safe_open

    folder = Path(folder).expanduser()
    index = folder / INDEX
    if not folder.is_dir():
        raise DecoderError(f"exit heads folder not found: {folder}")
    if not index.is_file():
        raise DecoderError(f"exit heads folder {folder} has no {INDEX}")
    meta = read_marked_json(index, FORMAT)
    if meta.get("version") != VERSION:
        raise DecoderError(f"{index}: unsupported version {meta.get('version')!r} (this reader knows {VERSION})")
    h = meta.get("hidden_size")
    if not isinstance(h, int) or isinstance(h, bool) or h < 1:
        raise DecoderError(f"{index}: 'hidden_size' must be a positive integer, got {h!r}")
    layers = _layer_list(meta.get("layers"), str(index))
    heads = {}
    for layer in layers:
        path = folder / layer_file(layer)
        if not path.is_file():
            raise DecoderError(f"exit heads: {INDEX} lists layer {layer} but {path.name} is missing in {folder}")
        try:
            with safe_open(str(path), framework="pt") as f:
                names = set(f.keys())
                if not {"weight", "bias"} <= names:
                    raise DecoderError(f"{path}: needs tensors 'weight' and 'bias', has {sorted(names)}")
                weight, bias = f.get_tensor("weight"), f.get_tensor("bias")
        except DecoderError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt file is an input error
            raise DecoderError(f"{path}: cannot read safetensors ({e})") from e
        _check_pair(layer, weight, bias, h, str(path))
        heads[layer] = (weight, bias)
    out = ExitHeads(h, heads, str(folder), meta)
    if num_layers is not None and hidden_size is not None:
        out.check_fits(num_layers, hidden_size)
    return out


def save_exit_heads(folder, heads: Mapping[int, tuple[torch.Tensor, torch.Tensor]], **meta) -> Path:
    """Write `heads` (layer -> (weight (H, H), bias (H,))) in the format above. Extra keyword
    arguments (e.g. model="smollm2-135m") go into exit_heads.json as provenance.

    Atomic: everything is written to a temporary folder beside `folder`, then renamed into
    place (an existing folder is replaced), so an interrupted save never leaves a loadable,
    half-written folder."""
    from safetensors.torch import save_file

    if not heads:
        raise DecoderError("save_exit_heads: no heads given")
    if any(k in meta for k in ("format", "version", "hidden_size", "layers")):
        raise DecoderError("save_exit_heads: metadata may not override format, version, hidden_size or layers")
    layers = sorted(int(l) for l in heads)
    hidden = int(next(iter(heads.values()))[0].shape[0])
    for layer in layers:
        _check_pair(layer, *heads[layer], hidden, "save_exit_heads")
    folder = Path(folder).expanduser()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.writing-"))
    try:
        for layer in layers:
            weight, bias = heads[layer]
            save_file({"weight": weight.detach().cpu().contiguous(), "bias": bias.detach().cpu().contiguous()},
                      str(tmp / layer_file(layer)))
        index = {"format": FORMAT, "version": VERSION, "hidden_size": hidden, "layers": layers, **meta}
        (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")  # last: the folder is complete
        _replace_dir(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename src to dst; an existing dst is moved aside first and removed after."""
    if dst.exists():
        if not dst.is_dir():
            raise DecoderError(f"{dst} exists and is not a folder")
        old = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.old-"))
        os.replace(dst, old / "x")
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


# Config values that change a model's output without touching a weight: heads trained (or
# continuations cached) for one value are not the other's.
OUTPUT_CONFIG = ("rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "head_dim", "num_attention_heads",
                 "num_key_value_heads", "sliding_window", "use_sliding_window", "hidden_act")


def model_fingerprint(model) -> str:
    """A short hash of a model's architecture (type, layers, sizes), the config values that shape
    its output (OUTPUT_CONFIG) and every weight tensor. Cached on the module (weights here are
    frozen once loaded)."""
    cached = getattr(model, "_decodegate_fingerprint", None)
    if cached is not None:
        return cached
    cfg = model.config
    h = hashlib.sha256(json.dumps([getattr(cfg, "model_type", "?"), cfg.num_hidden_layers, cfg.hidden_size,
                                   cfg.vocab_size, {k: getattr(cfg, k, None) for k in OUTPUT_CONFIG}],
                                  sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, t in model.state_dict().items():
            h.update(name.encode())
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    out = h.hexdigest()[:16]
    try:
        model._decodegate_fingerprint = out
    except AttributeError:  # pragma: no cover - a module that refuses attributes
        pass
    return out


def heads_hash(heads: ExitHeads) -> str:
    """Hash of the head tensors (what a calibration was made with)."""
    h = hashlib.sha256()
    for layer in heads.layers:
        w, b = heads.heads[layer]
        h.update(str(layer).encode())
        h.update(w.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        h.update(b.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def identity_heads(hidden_size: int, layers, *, dtype=torch.float32) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """All-zero residual heads (the identity map: reproduces the logit lens)."""
    return {int(l): (torch.zeros(hidden_size, hidden_size, dtype=dtype), torch.zeros(hidden_size, dtype=dtype))
            for l in layers}


__all__ = ["ExitHeads", "load_exit_heads", "save_exit_heads", "identity_heads", "model_fingerprint",
           "heads_hash", "FORMAT", "VERSION", "INDEX", "layer_file"]
