"""Where a decode step goes: one request under the torch profiler, its time split by part.

Parts: the model's pieces, found by module (`lm_head` with the final norm, `attention` without
its KV-cache writes, `mlp`, `norms`), the `kv_cache` writes, and the decoders' own scopes
(`sampling`: choice, margin, finiteness; `verify`: a speculative block's verdict; `draft_forward`,
`draft_pick`). Each part's time is the time of the torch operators inside it (`ops`) plus the
Python that ran inside it and outside any operator (`python`); `other_ops` are operators outside
every part (embedding, rotary tables, masks), and `python_loop` is the rest of the wall time (the
decoding loop itself). The prompt's prefill is left out. Fractions of a step hold up under load
far better than milliseconds, which is why they are what `bench --profile-round` prints.
"""
from __future__ import annotations

import contextlib
import time

import torch

from decoders.common import profiling_scopes

SCOPES = ("sampling", "verify", "draft_forward", "draft_pick")
MODULE_PARTS = ("lm_head", "attention", "mlp", "norms")
PARTS = MODULE_PARTS + ("kv_cache",) + SCOPES
PREFILL = "prefill"


def _module_labels(model) -> list[tuple[torch.nn.Module, str]]:
    body = getattr(model, "model", None)
    out = []
    head = model.get_output_embeddings()
    if head is not None:
        out.append((head, "lm_head"))
    if body is not None and getattr(body, "norm", None) is not None:
        out.append((body.norm, "lm_head"))
    for layer in getattr(body, "layers", []):
        for attr, part in (("self_attn", "attention"), ("mlp", "mlp"), ("input_layernorm", "norms"),
                           ("post_attention_layernorm", "norms")):
            if getattr(layer, attr, None) is not None:
                out.append((getattr(layer, attr), part))
    return out


@contextlib.contextmanager
def _labelled(models):
    """Forward hooks that open a profiler scope named after the part around each module, and
    the KV-cache layers' `update` wrapped the same way."""
    from transformers.cache_utils import DynamicLayer

    from decoders.kv import PreallocatedLayer
    handles, stack = [], []

    def enter(name):
        def hook(*_):
            ctx = torch.profiler.record_function(name)
            ctx.__enter__()
            stack.append(ctx)
        return hook

    def leave(*_):
        stack.pop().__exit__(None, None, None)

    seen = set()
    for model in models:
        for module, part in _module_labels(model):
            if id(module) in seen:
                continue
            seen.add(id(module))
            handles.append(module.register_forward_pre_hook(enter(part)))
            handles.append(module.register_forward_hook(leave))
    saved = {cls: cls.__dict__["update"] for cls in (DynamicLayer, PreallocatedLayer)}

    def wrap(original):
        def update(self, *args, **kwargs):
            with torch.profiler.record_function("kv_cache"):
                return original(self, *args, **kwargs)
        return update
    try:
        for cls, original in saved.items():
            setattr(cls, "update", wrap(original))
        yield
    finally:
        for cls, original in saved.items():
            setattr(cls, "update", original)
        for h in handles:
            h.remove()


def profile_request(decoder, request, models=None) -> dict:
    """Run `decoder.generate(request)` once under the profiler. Returns seconds per part (ops and
    Python separately), the decode wall time without prefill, the steps taken, and fractions."""
    from torch.profiler import ProfilerActivity, profile
    models = models or [decoder.target.model]
    with _labelled(models), profiling_scopes(), profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        result = decoder.generate(request)
        wall = time.perf_counter() - t0
    labels = set(PARTS) | {PREFILL}
    ops = dict.fromkeys(PARTS + ("other_ops",), 0.0)
    python = dict.fromkeys(PARTS, 0.0)
    prefill = 0.0
    for ev in prof.events():
        if ev.name == PREFILL and _label_of(ev.cpu_parent, labels) is None:
            prefill += ev.cpu_time_total / 1e6
        part = _label_of(ev if ev.name in labels else ev.cpu_parent, labels)
        if part == PREFILL or _label_of(ev.cpu_parent, {PREFILL}) == PREFILL:
            continue  # the prompt's prefill, module parts inside it included
        self_s = ev.self_cpu_time_total / 1e6
        if ev.name in labels:
            python[ev.name] += self_s
        else:
            ops[part or "other_ops"] += self_s
    decode = max(wall - prefill, 1e-12)
    accounted = sum(ops.values()) + sum(python.values())
    steps = max(1, int(result.stats.get("target_forwards", 1)) - 1)
    seconds = {f"{p}_ops": ops[p] for p in ops} | {f"{p}_python": python[p] for p in python}
    seconds["python_loop"] = max(0.0, decode - accounted)
    # Parts by operator time; all Python (inside parts and in the loop) in one overhead figure.
    fractions = {p: ops[p] / decode for p in ops}
    fractions["python_overhead"] = (sum(python.values()) + seconds["python_loop"]) / decode
    return {"decode_s": decode, "prefill_s": prefill, "steps": steps, "tokens": len(result.tokens),
            "ms_per_step": 1e3 * decode / steps, "seconds": seconds, "fractions": fractions,
            "python_fraction": fractions["python_overhead"],
            "ops_fraction": sum(ops.values()) / decode}


def _label_of(ev, labels):
    while ev is not None:
        if ev.name in labels:
            return ev.name
        ev = ev.cpu_parent
    return None
