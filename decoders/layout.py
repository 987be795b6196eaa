"""Weights laid out for decoding on a CPU (issue 26): the one-token step reads them at the memory's
pace, and a block of K+1 rows through oneDNN instead of MKL's small-M GEMM.

Why: `nn.Linear` keeps W as (out, in). For one row, MKL's x @ W^T over that layout streams the
weights at about half the machine's bandwidth (smollm2-135m's LM head: 12.2 ms; the same product
over W^T stored contiguous, (in, out): 5.9 ms). For 2 to a few hundred rows, oneDNN on a prepacked
copy of W takes 0.5-0.7x MKL's time (measured on a 2-core AMD EPYC, one thread).

`prepare(model)` does, once per model, on a CPU, in fp32:
- every projection of a decoder layer is re-pointed to a transposed view of a contiguous (in, out)
  tensor; q/k/v share one such tensor, and so do gate/up, so `decoders.lean` runs each group as one
  product. A view of a column slice gives bit-identical numbers to the fused product (each output
  column is its own dot product; tests/test_lean.py), so transformers' own modules, the lean step
  and the hf peers all compute the same logits;
- the LM head gets its own (in, out) copy (a tied input embedding keeps the original table: a row
  gather from a transposed table would stride across the whole matrix);
- each projection keeps a oneDNN-packed copy for inputs of more than one row (prefill, K+1
  verification, batched references): one extra copy of the weights in memory.

Each prepared module becomes a `FastLinear` (a subclass: `isinstance(m, nn.Linear)` still holds);
a deep copy of a prepared model is a plain one, laid out again on its first forward.
Nothing changes on CUDA, in bf16/fp16, for quantized modules, or when oneDNN is missing: `prepare`
returns False and the model runs as it was; nor when the extra copy would take more than half of
the free memory. `DECODEGATE_LAYOUT=0` turns it off.
"""
from __future__ import annotations

import copy
import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

_FUSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its laid-out tensors
PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
               ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))


class FastLinear(nn.Linear):
    """`nn.Linear` over a transposed weight view (one row: a plain product over the (in, out)
    layout) with a oneDNN-packed copy for several rows. Under autograd it is `nn.Linear`."""

    _packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self._packed is None or x.numel() == self.in_features or x.device.type != "cpu"
                or x.dtype != torch.float32 or (torch.is_grad_enabled() and x.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def __deepcopy__(self, memo):
        # A copy is a plain nn.Linear over a contiguous (out, in) weight: oneDNN's packed tensor
        # cannot be copied, and a copied model is laid out again on its first use.
        clone = nn.Linear.__new__(nn.Linear)
        memo[id(self)] = clone
        clone.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "_packed"})
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


def _can_pack() -> bool:
    try:
        w = torch.ones(4, 8)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 16)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(3, 8), packed, None, "none", [], "")
        return bool(torch.equal(out, torch.full((3, 4), 8.0)))
    except (RuntimeError, AttributeError):
        return False


def _relay(modules: list[nn.Linear], pack: bool) -> torch.Tensor:
    """Point each module's weight at a column slice of one contiguous (in, out_total) tensor."""
    fused = torch.cat([m.weight.detach() for m in modules]).t().contiguous()
    start = 0
    for m in modules:
        w = m.weight.detach()
        if pack:
            m._packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 16)
        m.weight = nn.Parameter(fused[:, start:start + m.out_features].t(), requires_grad=False)
        start += m.out_features
        m.__class__ = FastLinear
        m._register_state_dict_hook(_contiguous)
    return fused


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
    pack = _can_pack()
    fused = []
    for layer in model.model.layers:
        fused.append([_relay([getattr(getattr(layer, part), n) for n in names], pack) for part, names in PROJECTIONS])
    head = model.lm_head
    emb = model.get_input_embeddings()
    if emb is not None and emb.weight is head.weight:
        emb.weight = nn.Parameter(head.weight.detach(), requires_grad=False)  # the table stays row-major
    fused.append(_relay([head], pack))
    _FUSED[model] = fused
    return True


def fused_weights(model):
    """Per layer [(in, q+k+v), (in, out) of o, (in, gate+up), (in, out) of down],
    then the head's (in, V): the contiguous tensors `prepare` made; None for an unprepared model."""
    return _FUSED.get(model)


def intact(model) -> bool:
    """Whether a prepared model still holds the prepared weights (a later `.to(device or dtype)`
    replaces them with copies; the model then runs as transformers' modules only)."""
    fused = fused_weights(model)
    return fused is not None and model.lm_head.weight.data_ptr() == fused[-1].data_ptr()

