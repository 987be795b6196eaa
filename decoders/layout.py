"""Weights laid out for decoding on a CPU (issue 26): a one-token step and a block of K+1 rows read
them at the memory's pace.

Why: `nn.Linear` keeps W as (out, in). For one row, MKL's x @ W^T over that layout streams the
weights at about half the machine's bandwidth (smollm2-135m's LM head: 12.2 ms; the same product
over W^T stored contiguous, (in, out): 5.9 ms). For 2 to 16 rows, `decoders.panel`'s kernel over a
copy packed in panels is faster still (5 rows: 35 ms for all of smollm2's products against 62 with
oneDNN and 98 with MKL; one row: 27 against 30-32; a 2-core AMD EPYC, one thread).

`prepare(model)` does, once per model, on a CPU, in fp32:
- every projection of a decoder layer is re-pointed to a transposed view of a contiguous (in, out)
  tensor; q/k/v share one such tensor, and so do gate/up, so `decoders.lean` runs each group as one
  product. A view of a column slice gives bit-identical numbers to the fused product (each output
  column is its own dot product; tests/test_lean.py), so transformers' own modules, the lean step
  and the hf peers all compute the same logits;
- the LM head gets its own (in, out) copy (a tied input embedding keeps the original table: a row
  gather from a transposed table would stride across the whole matrix);
- each group keeps a copy packed in `decoders.panel`'s panels for inputs of up to 16 rows (one
  token, K+1 verification); each module's panels are a slice of its group's where its width is a
  multiple of 16. More rows (a prefill, a batched reference) go through MKL over the (in, out)
  layout. One extra copy of the weights in memory.

Each prepared module becomes a `FastLinear` (a subclass: `isinstance(m, nn.Linear)` still holds);
a deep copy of a prepared model is a plain one, laid out again on its first forward.
Nothing changes on CUDA, in bf16/fp16, or for quantized modules: `prepare` returns False and the
model runs as it was; nor when the extra copy would take more than half of the free memory.
`DECODEGATE_LAYOUT=0` turns it off; `DECODEGATE_PANEL=0` (or no C compiler) keeps the layout
without the panels (every product through MKL).
"""
from __future__ import annotations

import copy
import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from decoders import panel

_FUSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its laid-out tensors
PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
               ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))


class FastLinear(nn.Linear):
    """`nn.Linear` over a transposed weight view (a plain product over the (in, out) layout), with
    panels for up to 16 rows. Under autograd it is `nn.Linear`."""

    _panels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self._panels is not None and x.numel() <= panel.MAX_ROWS * self.in_features and x.device.type == "cpu"
                and x.dtype == torch.float32 and not (torch.is_grad_enabled() and x.requires_grad)
                and panel.enabled()):
            return panel.linear(x, self._panels, self.out_features, self.bias)
        return F.linear(x, self.weight, self.bias)

    def __deepcopy__(self, memo):
        # A copy is a plain nn.Linear over a contiguous (out, in) weight (not a view into the
        # original's layout); a copied model is laid out again on its first use.
        clone = nn.Linear.__new__(nn.Linear)
        memo[id(self)] = clone
        clone.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "_panels"})
        clone.weight = nn.Parameter(clone.weight.detach().contiguous(), requires_grad=self.weight.requires_grad)
        return clone


def enabled() -> bool:
    return os.environ.get("DECODEGATE_LAYOUT", "1") != "0"


def available_memory() -> int | None:
    """Bytes of physical memory free now (Linux), or None where the system does not say."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _fits(model) -> bool:
    # The layout keeps one more copy of the projections (the packed one) and, for a tied head,
    # of the embedding table: lay out only when that takes at most half of the free memory, so a
    # model that fitted before still fits.
    extra = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))
    free = available_memory()
    return free is None or 2 * extra <= free


def supported(model) -> bool:
    """A Llama-style decoder (llama, mistral, qwen2) in fp32 on a CPU with plain nn.Linear
    projections: the shapes `prepare` and `decoders.lean` know."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    head = getattr(model, "lm_head", None)
    if layers is None or type(head) not in (nn.Linear, FastLinear) or not len(layers):
        return False
    if head.weight.device.type != "cpu" or head.weight.dtype != torch.float32:
        return False
    for layer in layers:
        for part, names in PROJECTIONS:
            block = getattr(layer, part, None)
            if block is None or any(type(getattr(block, n, None)) not in (nn.Linear, FastLinear) for n in names):
                return False
    return True


def _aligned(modules) -> bool:
    return all(m.out_features % panel.NB == 0 for m in modules)


def _panel_floats(modules) -> int:
    widths = [sum(m.out_features for m in modules)] if _aligned(modules) else [m.out_features for m in modules]
    return sum(panel.packed_numel(modules[0].in_features, n) for n in widths)


def _relay(modules: list[nn.Linear], arena) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Point each module's weight at a column slice of one contiguous (in, out_total) tensor;
    with an `arena`, also pack the group's panels there (None where a width is not a multiple of
    16: then each module packs its own and the group has none)."""
    fused = torch.cat([m.weight.detach() for m in modules]).t().contiguous()
    aligned = arena is not None and _aligned(modules)
    panels = panel.pack(fused, arena) if aligned else None
    start = 0
    for m in modules:
        cols = fused[:, start:start + m.out_features]
        if aligned:
            m._panels = panels[start // panel.NB:(start + m.out_features) // panel.NB]
        elif arena is not None:
            m._panels = panel.pack(cols, arena)
        m.weight = nn.Parameter(cols.t(), requires_grad=False)
        start += m.out_features
        m.__class__ = FastLinear
        m._register_state_dict_hook(_contiguous)
    if len(modules) == 1 and arena is not None:
        panels = modules[0]._panels
    return fused, panels


def _contiguous(module, state_dict, prefix, local_metadata):
    # Saved checkpoints hold the usual contiguous (out, in) weights, not views of the layout.
    state_dict[prefix + "weight"] = state_dict[prefix + "weight"].contiguous()


@torch.no_grad()
def prepare(model) -> bool:
    """Lay `model`'s weights out as above, once. True when the model is (now) prepared."""
    if model in _FUSED:
        return intact(model)
    if not enabled() or not supported(model) or not _fits(model):
        return False
    groups = [[getattr(getattr(layer, part), n) for n in names]
              for layer in model.model.layers for part, names in PROJECTIONS] + [[model.lm_head]]
    # All panels in one buffer: one huge-page region for the kernel's weight stream.
    arena = panel.Arena(sum(_panel_floats(g) for g in groups)) if panel.available() else None
    emb, head = model.get_input_embeddings(), model.lm_head
    if emb is not None and emb.weight is head.weight:
        emb.weight = nn.Parameter(head.weight.detach(), requires_grad=False)  # the table stays row-major
    laid = [_relay(g, arena) for g in groups]
    per = len(PROJECTIONS)
    fused = [laid[i:i + per] for i in range(0, len(laid) - 1, per)] + [laid[-1]]
    _FUSED[model] = fused
    return True


def fused_weights(model):
    """Per layer [(in, q+k+v), (in, out) of o, (in, gate+up), (in, out) of down], then the
    head's (in, V): each the contiguous tensor `prepare` made and its panels (or None); None for
    an unprepared model."""
    return _FUSED.get(model)


def intact(model) -> bool:
    """Whether a prepared model still holds the prepared weights (a later `.to(device or dtype)`
    replaces them with copies; the model then runs as transformers' modules only)."""
    fused = fused_weights(model)
    return fused is not None and model.lm_head.weight.data_ptr() == fused[-1][0].data_ptr()

