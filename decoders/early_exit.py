"""`early-exit`: stop running layers for a token once an intermediate layer is confident enough
(CALM, Schuster et al. 2022), with state propagation for the layers it skipped.

For each new token the decoder runs the layers in order. At each configured exit layer `l`
(counted as layers run: the hidden state after decoder layers 0 .. l-1) it computes a confidence:

- `softmax`:    max_v p_l(v), p_l = softmax(lm_head(norm(h_l)))            (one LM-head evaluation)
- `margin`:     p_l(top-1) - p_l(top-2), probabilities as above           (one LM-head evaluation)
- `saturation`: cos(h_l, h_prev), clamped to [0, 1], where h_prev is the hidden state at the
                previous exit layer (the embedding output for the first one). No LM head.

Confidences use the raw softmax (temperature 1), so greedy and sampled requests take the same
exit decisions. Where `h_l` goes through an exit head first (see `decoders.exit_heads`), the
head's output is what the LM head reads.

Exit rule: token exits at `l` iff `threshold_l < 1` and `confidence >= threshold_l`. A threshold
of 1.0 disables that exit layer (it is not even checked, so costs nothing): with 1.0 everywhere
the decoder runs every layer and is token-identical to `standard`, greedy and sampled, because it
samples with the same keyed noise of the token's absolute position. A threshold of 0 always fires
at the first enabled exit layer (all three confidences are >= 0).

On exit the token is chosen from layer `l`'s logits (greedy argmax, or Gumbel-max with the shared
sampling primitives), and layers [l, L) get keys and values computed from the copied hidden
state `h_l` (their input norm, K/V projections and rotary embedding only), so later tokens that
run deeper can attend to this one.

The prompt always runs through every layer (its upper-layer cache must be exact). The first new
token still takes the exit rule on the prompt's last position, so the decoder's output is one
function of the rule; that exit saves nothing, since the prompt pass is full depth anyway.

Stats per request (besides the shared `target_forwards`, `draft_forwards`, `proposed`,
`accepted`, `fallbacks`, which are 0 except `target_forwards`):
- `exit_layers`: per new token, the depth whose logits chose it, as the number of decoder layers
  run (an exit after layer index l-1 is `l`; no exit is `num_layers`).
- `num_layers`, `avg_layers` (mean of `exit_layers`).
- `exit_confidences`: per token, the confidence at that depth (at full depth it is computed from
  the final logits or final hidden state, at no extra head cost).
- `lm_head_checks`: LM-head evaluations spent computing confidences (softmax / margin checks,
  the firing one included). Not counted: the final-layer head that produces a full-depth token,
  and the head that produces a token after a `saturation` exit.
- `lm_head_evals`: every LM-head evaluation in the request (checks + producing heads), the
  number `analysis.exits` needs for its cost model.
- `confidence`, `exit_points`, `thresholds`: the configuration used.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from decoders.adapter import LayerAdapter
from decoders.base import Decoder, DecoderError, GenerationRequest, GenerationResult
from decoders.common import Emitter, check_prompt_fits, pick_and_margin, reject_options, scope, sync
from decoders.kv import DEFAULT_CACHE, CachePool, request_capacity
from decoders.exit_heads import ExitHeads, heads_hash, load_exit_heads, model_fingerprint, read_marked_json
from decoders.sampling import prompt_key

CONFIDENCES = ("softmax", "margin", "saturation")
DEFAULT_THRESHOLD = 0.9
DEFAULT_CONFIDENCE = "softmax"


# ------------------------------------------------------------------------------- confidences

def softmax_confidence(logits: torch.Tensor) -> float:
    """Largest softmax probability of logits (..., V), last row."""
    return float(torch.softmax(logits.reshape(-1, logits.shape[-1])[-1].float(), dim=-1).max())


def margin_confidence(logits: torch.Tensor) -> float:
    """Top-1 minus top-2 softmax probability, in [0, 1]."""
    p = torch.softmax(logits.reshape(-1, logits.shape[-1])[-1].float(), dim=-1)
    top = torch.topk(p, 2).values
    return float(top[0] - top[1])


def saturation_confidence(hidden: torch.Tensor, previous: torch.Tensor) -> float:
    """Cosine between two hidden states (..., H) (last row of each), clamped to [0, 1]."""
    a = hidden.reshape(-1, hidden.shape[-1])[-1].float()
    b = previous.reshape(-1, previous.shape[-1])[-1].float()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=0)
    return min(max(float(cos), 0.0), 1.0)


# ------------------------------------------------------------------------------ configuration

def default_exit_layers(num_layers: int) -> tuple[int, ...]:
    """Every num_layers // 4 layers (at least every layer), below the last: 30 -> 7, 14, 21, 28;
    4 -> 1, 2, 3. The final layer is always the implicit last exit."""
    step = max(1, num_layers // 4)
    return tuple(range(step, num_layers, step))


def _as_layer(value, what: str) -> int:
    if isinstance(value, bool):
        raise DecoderError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise DecoderError(f"{what} must be an integer, got {value!r}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise DecoderError(f"{what} must be an integer, got {value!r}")
    return value


def _as_threshold(value, what: str) -> float:
    if isinstance(value, bool):
        raise DecoderError(f"{what} must be a number in [0, 1], got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise DecoderError(f"{what} must be a number in [0, 1], got {value!r}") from None
    if not (math.isfinite(x) and 0.0 <= x <= 1.0):
        raise DecoderError(f"{what} must be in [0, 1], got {value!r}")
    return x


def parse_threshold(value):
    """One threshold (a number, or a string holding one), a list (one per exit layer), a mapping
    layer -> threshold, or the string form "7:0.8,14:0.9" (the CLI's). Returns a float, a list
    or a dict of layer -> float; range checks happen when the exit layers are known."""
    if isinstance(value, str):
        text = value.strip()
        if ":" not in text:
            return _as_threshold(text, "threshold")
        out = {}
        for part in text.split(","):
            layer, sep, x = part.partition(":")
            if not sep:
                raise DecoderError(f"threshold: expected LAYER:VALUE pairs like 7:0.8,14:0.9, got {value!r}")
            layer = _as_layer(layer, "threshold layer")
            if layer in out:
                raise DecoderError(f"threshold: layer {layer} is given twice in {value!r}")
            out[layer] = _as_threshold(x, f"threshold for layer {layer}")
        return out
    if isinstance(value, Mapping):
        out = {}
        for layer, x in value.items():
            layer = _as_layer(layer, "threshold layer")
            if layer in out:
                raise DecoderError(f"threshold: layer {layer} is given twice")
            out[layer] = _as_threshold(x, f"threshold for layer {layer}")
        if not out:
            raise DecoderError("threshold: an empty per-layer mapping; give at least one layer")
        return out
    if isinstance(value, (list, tuple)):
        if not value:
            raise DecoderError("threshold: an empty list; give one threshold per exit layer")
        return [_as_threshold(x, f"threshold[{i}]") for i, x in enumerate(value)]
    return _as_threshold(value, "threshold")


@dataclass(frozen=True)
class ExitPlan:
    """Where to check and when to exit. `exit_layers` ascending, each in [1, num_layers)."""

    num_layers: int
    exit_layers: tuple[int, ...]
    thresholds: tuple[float, ...]
    confidence: str

    def fires(self, index: int, confidence: float) -> bool:
        t = self.thresholds[index]
        return t < 1.0 and confidence >= t

    def enabled(self, index: int) -> bool:
        return self.thresholds[index] < 1.0


def make_plan(num_layers: int, *, threshold=DEFAULT_THRESHOLD, exit_layers=None, confidence=DEFAULT_CONFIDENCE,
              head_layers: tuple[int, ...] | None = None) -> ExitPlan:
    """Validate options into an ExitPlan. Exit layers come from, in order: `exit_layers`, the keys
    of a per-layer threshold mapping, the exit heads' layers, the default spacing."""
    if confidence not in CONFIDENCES:
        raise DecoderError(f"confidence must be one of {', '.join(CONFIDENCES)}; got {confidence!r}")
    if num_layers < 2:
        raise DecoderError(f"early exit needs a model with at least 2 layers; this one has {num_layers}")
    threshold = parse_threshold(DEFAULT_THRESHOLD if threshold is None else threshold)
    if exit_layers is not None:
        if isinstance(exit_layers, (str, int)):
            exit_layers = str(exit_layers).split(",")
        layers = [_as_layer(l, "exit layer") for l in exit_layers]
        if not layers:
            raise DecoderError("exit_layers is empty: give at least one layer in [1, "
                               f"{num_layers}) (or threshold 1.0 to never exit)")
    elif isinstance(threshold, dict):
        layers = list(threshold)
    elif head_layers:
        layers = list(head_layers)
    else:
        layers = list(default_exit_layers(num_layers))
    bad = [l for l in layers if not 1 <= l < num_layers]
    if bad:
        raise DecoderError(f"exit layer(s) {bad} outside [1, {num_layers}): an exit layer counts the layers "
                           f"run before it; the final layer {num_layers} is always the last exit")
    if len(set(layers)) != len(layers):
        raise DecoderError(f"exit layers list a layer twice: {layers}")
    layers = sorted(layers)
    if isinstance(threshold, dict):
        if set(threshold) != set(layers):
            raise DecoderError(f"per-layer thresholds name layers {sorted(threshold)} but the exit layers are "
                               f"{layers}: give one threshold for each exit layer")
        thresholds = [threshold[l] for l in layers]
    elif isinstance(threshold, list):
        if len(threshold) != len(layers):
            raise DecoderError(f"{len(threshold)} thresholds for {len(layers)} exit layers {layers}: "
                               f"give one threshold, or one per exit layer")
        thresholds = threshold  # in the order of exit layers as given, ascending after sort
        if exit_layers is not None:
            given = [_as_layer(l, "exit layer") for l in exit_layers]
            thresholds = [x for _, x in sorted(zip(given, threshold))]
    else:
        thresholds = [threshold] * len(layers)
    if head_layers is not None:
        missing = [l for l in layers if l not in head_layers]
        if missing:
            raise DecoderError(f"exit layer(s) {missing} have no exit head (the heads cover {list(head_layers)})")
    return ExitPlan(num_layers, tuple(layers), tuple(float(x) for x in thresholds), confidence)


# ------------------------------------------------------------------------- calibrated thresholds

CALIBRATION_FORMAT = "decodegate-exit-calibration"
CALIBRATION_FILE = "exit_calibration.json"
CALIBRATED = "calibrated:"


def load_calibration(folder) -> dict:
    """Read `decodegate calibrate-exits`'s output folder (exit_calibration.json): thresholds per
    exit layer, the confidence, the exit heads (path and hash, or none: the logit lens), the
    target fingerprint, and the guarantee (epsilon, delta, n)."""
    folder = Path(str(folder)).expanduser()
    path = folder / CALIBRATION_FILE if folder.is_dir() or not folder.suffix else folder
    if not path.is_file():
        raise DecoderError(f"calibrated thresholds: {path} not found (make it with `decodegate calibrate-exits`)")
    cal = read_marked_json(path, CALIBRATION_FORMAT)
    for key in ("thresholds", "confidence", "target_fingerprint"):
        if key not in cal:
            raise DecoderError(f"{path}: missing key {key!r}")
    cal["_path"] = str(path)
    return cal


def _resolve_calibrated(threshold, exit_heads, exit_layers, confidence, target, fingerprint):
    """Turn threshold="calibrated:DIR" into (thresholds, exit_heads, confidence), refusing a
    calibration made for another target, other heads, or another confidence."""
    cal = load_calibration(threshold[len(CALIBRATED):])
    where = cal["_path"]
    if cal["target_fingerprint"] != fingerprint:
        raise DecoderError(f"{where} was calibrated for target {cal.get('target', '?')!r} (fingerprint "
                           f"{cal['target_fingerprint']}), not for {target.name!r} (fingerprint {fingerprint})")
    if confidence not in (None, DEFAULT_CONFIDENCE, cal["confidence"]):
        raise DecoderError(f"{where} was calibrated with confidence {cal['confidence']!r}, not {confidence!r}")
    if exit_layers is not None:
        raise DecoderError(f"{where} fixes the exit layers ({sorted(cal['thresholds'])}); do not also give exit_layers")
    want = cal.get("heads_hash")
    if exit_heads is None and cal.get("exit_heads"):
        exit_heads = cal["exit_heads"]
    if want is None and exit_heads is not None:
        raise DecoderError(f"{where} was calibrated without exit heads (the logit lens); do not give exit_heads")
    if want is not None:
        if exit_heads is None:
            raise DecoderError(f"{where} was calibrated with exit heads {cal.get('exit_heads')!r}: give exit_heads")
        heads = exit_heads if isinstance(exit_heads, ExitHeads) else load_exit_heads(Path(exit_heads))
        if heads_hash(heads) != want:
            raise DecoderError(f"{where} was calibrated with other exit heads (hash {want}) than "
                               f"{heads.source or 'the ones given'} (hash {heads_hash(heads)}): calibrate again")
        exit_heads = heads
    return {int(k): float(v) for k, v in cal["thresholds"].items()}, exit_heads, cal["confidence"]


# ----------------------------------------------------------------------------------- decoder

@dataclass
class _Exit:
    logits: torch.Tensor      # (1, V): the distribution the token is chosen from
    layers: int               # depth, in layers run
    confidence: float
    checks: int               # LM-head evaluations spent on confidence checks
    evals: int                # all LM-head evaluations


class EarlyExitDecoder(Decoder):
    """Options: `threshold` (float, list per exit layer, mapping layer -> float, "7:0.8,14:0.9",
    or "calibrated:DIR": the thresholds, confidence and exit heads that `decodegate
    calibrate-exits` wrote to DIR), `exit_layers` (list of ints in [1, num_layers)), `confidence`
    (softmax | margin | saturation), `exit_heads` (a folder in the `decoders.exit_heads` format,
    or an `ExitHeads`; heads trained for another target are refused), `cache` ("static", the
    default, or "dynamic": see `decoders.kv`)."""

    name = "early-exit"

    def __init__(self, target, *, threshold=DEFAULT_THRESHOLD, exit_layers=None, confidence=DEFAULT_CONFIDENCE,
                 exit_heads=None, cache: str = DEFAULT_CACHE, **options):
        reject_options(self.name, options)
        self.target = target
        self.adapter = LayerAdapter(target.model)   # refuses unsupported architectures
        self.pool = CachePool(target.model, cache)
        n = self.adapter.num_layers
        hidden_size = int(target.model.config.hidden_size)
        self.calibration = None
        if isinstance(threshold, str) and threshold.strip().startswith(CALIBRATED):
            self.calibration = threshold.strip()
            threshold, exit_heads, confidence = _resolve_calibrated(
                threshold.strip(), exit_heads, exit_layers, confidence, target, model_fingerprint(target.model))
        self.heads: ExitHeads | None = None
        if exit_heads is not None:
            heads = exit_heads if isinstance(exit_heads, ExitHeads) else load_exit_heads(Path(exit_heads))
            heads.check_fits(n, hidden_size, fingerprint=model_fingerprint(target.model),
                             model_name=getattr(target, "name", "this model"))
            param = next(target.model.parameters())
            self.heads = heads.to(device=param.device, dtype=param.dtype)
        self.plan = make_plan(n, threshold=threshold, exit_layers=exit_layers,
                              confidence=confidence if confidence is not None else DEFAULT_CONFIDENCE,
                              head_layers=self.heads.layers if self.heads else None)

    # ----------------------------------------------------------------------------- pieces
    def exit_logits(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (T, V) read from the hidden state (1, T, H) after `layer` layers."""
        if layer < self.plan.num_layers and self.heads is not None:
            hidden = self.heads.apply(layer, hidden)
        return self.adapter.head(hidden)

    def _check(self, layer: int, last: torch.Tensor, previous: torch.Tensor):
        """(confidence, logits or None) at an exit layer, for the last position (1, 1, H)."""
        if self.plan.confidence == "saturation":
            return saturation_confidence(last, previous), None
        logits = self.exit_logits(layer, last)
        f = softmax_confidence if self.plan.confidence == "softmax" else margin_confidence
        return f(logits), logits

    def _final_confidence(self, logits: torch.Tensor, last: torch.Tensor, previous: torch.Tensor) -> float:
        if self.plan.confidence == "saturation":
            return saturation_confidence(last, previous)
        return (softmax_confidence if self.plan.confidence == "softmax" else margin_confidence)(logits)

    @torch.inference_mode()
    def step(self, hidden: torch.Tensor, cache, position: int, *, full: bool = False) -> _Exit:
        """Run hidden (1, T, H) of tokens starting at absolute `position` through the layers,
        deciding the next token from the last position. `full`: run every layer anyway (the
        prompt); otherwise stop at the exit and propagate state into the skipped layers."""
        plan, n = self.plan, self.plan.num_layers
        start, previous, chosen = 0, hidden[:, -1:], None
        checks = evals = 0
        for i, layer in enumerate(plan.exit_layers):
            hidden = self.adapter.run_layers(hidden, start, layer, cache, position)
            start = layer
            last = hidden[:, -1:]                                  # (1, 1, H)
            if chosen is None and plan.enabled(i):
                conf, logits = self._check(layer, last, previous)
                if logits is not None:
                    checks += 1
                    evals += 1
                if plan.fires(i, conf):
                    if logits is None:                              # saturation: head only now
                        logits = self.exit_logits(layer, last)
                        evals += 1
                    chosen = _Exit(logits, layer, conf, checks, evals)
                    if not full:
                        # CALM state propagation: layers [layer, n) see h_layer as their input.
                        self.adapter.propagate(hidden, layer, n, cache, position)
                        return chosen
            previous = last
        hidden = self.adapter.run_layers(hidden, start, n, cache, position)
        if chosen is not None:
            return chosen
        last = hidden[:, -1:]
        logits = self.adapter.head(last)
        return _Exit(logits, n, self._final_confidence(logits, last, previous), checks, evals + 1)

    # ----------------------------------------------------------------------------- forced
    @torch.inference_mode()
    def teacher_forced(self, prompt_ids, tokens) -> tuple[list[int], list[int]]:
        """Feed `tokens` (e.g. the full-depth greedy continuation) after the prompt, exiting and
        propagating state as `generate` does, and return per position (exit layer, the greedy
        token this decoder would have chosen there). A disagreement at position i is what
        early exit changes given the same prefix, with its own (propagated) cache."""
        device = self.target.device
        self.adapter.check_capacity(len(prompt_ids) + len(tokens))
        cache = self.pool.new(len(prompt_ids) + len(tokens) + 1)
        position = len(prompt_ids)
        ex = self.step(self.adapter.embed(torch.tensor([list(prompt_ids)], device=device)), cache, 0, full=True)
        layers, chosen = [], []
        for i, token in enumerate(tokens):
            layers.append(ex.layers)
            chosen.append(int(ex.logits[-1].argmax()))
            if i + 1 < len(tokens):
                ex = self.step(self.adapter.embed(torch.tensor([[int(token)]], device=device)), cache, position)
                position += 1
        return layers, chosen

    # ----------------------------------------------------------------------------- loop
    def generate(self, request: GenerationRequest) -> GenerationResult:
        return self._generate(request, private=False)[0]

    def generate_with_cache(self, request: GenerationRequest):
        """`generate`, also returning the KV cache it built (for tests and forensics); that
        cache is the caller's: no later request writes into it."""
        return self._generate(request, private=True)

    @torch.inference_mode()
    def _generate(self, request: GenerationRequest, private: bool):
        model, device = self.target.model, self.target.device
        out = Emitter(request, self.target.tokenizer, check_prompt_fits(model, request))
        key = prompt_key(request.seed, request.prompt_ids)
        capacity = request_capacity(model, len(request.prompt_ids), out.max_new)
        self.adapter.check_capacity(capacity)
        cache = self.pool.new(capacity, private=private)
        position = len(request.prompt_ids)          # absolute position of the next new token
        ids = torch.tensor([request.prompt_ids], device=device)
        with scope("prefill"):
            ex = self.step(self.adapter.embed(ids), cache, 0, full=True)
        forwards, layers, confidences, checks, evals = 1, [], [], 0, 0
        while True:
            with scope("sampling"):
                token, margin = pick_and_margin(ex.logits, request, key, position,
                                                f"position {position} (layer {ex.layers})")
            layers.append(ex.layers)
            confidences.append(ex.confidence)
            checks += ex.checks
            evals += ex.evals
            if out.emit(token, margin):
                break
            ex = self.step(self.adapter.embed(torch.tensor([[token]], device=device)), cache, position)
            forwards += 1
            position += 1
        sync(device)
        stats = {
            "target_forwards": forwards, "draft_forwards": 0, "proposed": 0, "accepted": 0, "fallbacks": 0,
            "exit_layers": layers, "num_layers": self.plan.num_layers,
            "avg_layers": sum(layers) / len(layers), "exit_confidences": confidences,
            "lm_head_checks": checks, "lm_head_evals": evals,
            "confidence": self.plan.confidence, "exit_points": list(self.plan.exit_layers),
            "thresholds": list(self.plan.thresholds),
            "exit_heads": self.heads.source if self.heads is not None else None,
        }
        if self.calibration:
            stats["calibration"] = self.calibration
        return out.result(self.name, stats), cache
