"""Early exit (`decoders.early_exit`) and exit heads (`decoders.exit_heads`) on tiny models.

The references here are written independently of the decoder and of `LayerAdapter`: a layer is
recomputed by hand (norms, projections, rotary, causal attention, MLP) over the whole sequence
each step, with no cache, and a position that exited at depth l keeps its hidden state frozen at
h_l in every later layer: its keys and values there come from the copied state, which is what
state propagation must write.
"""
from __future__ import annotations

import copy
import json
import math
from collections import Counter

import pytest
import torch

from decoders import GenerationRequest
from decoders.base import DecoderError
from decoders.early_exit import (EarlyExitDecoder, ExitPlan, default_exit_layers, make_plan,
                                 parse_threshold)
from decoders.exit_heads import identity_heads, load_exit_heads, save_exit_heads
from decoders.sampling import choose, prompt_key
from decoders.standard import StandardDecoder
from harness.models import LoadedModel, build_tiny
from numerics import assert_close_scaled, tolerance

LAYERS = 6


@pytest.fixture(scope="module")
def llama():
    return build_tiny("llama", seed=1, layers=LAYERS)


@pytest.fixture(scope="module")
def qwen2():
    return build_tiny("qwen2", seed=2, layers=LAYERS)


def request(t, n=20, **kw):
    ids = tuple(t.encode("The quick brown fox"))
    return GenerationRequest(ids, max_new_tokens=n, **kw)  # no stop tokens: always n tokens


GREEDY = {}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7}


# ----------------------------------------------------------------------- independent reference

def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def _rope(cfg, head_dim, n):
    """cos and sin of the rotary embedding, with the config's base and scaling (the tiny models
    set both: harness.models.TINY_OVERRIDES); a scaled rope's frequencies from transformers' own
    formulas (an implementation the decoder under test does not share)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    kind, scale = params.get("rope_type", "default"), 1.0
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if kind != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        inv, scale = ROPE_INIT_FUNCTIONS[kind](cfg, None)
    f = torch.arange(n, dtype=torch.float32)[:, None] * inv.float()[None]
    emb = torch.cat([f, f], dim=-1)
    return emb.cos() * scale, emb.sin() * scale  # (T, D)


def _layer(layer, cfg, h, cos, sin):
    """One decoder layer by hand over the whole sequence h (T, H): (keys, values, output)."""
    a = layer.self_attn
    T, nh, nkv, d = h.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, a.head_dim
    x = layer.input_layernorm(h)
    q = a.q_proj(x).view(T, nh, d).transpose(0, 1)   # (nh, T, d)
    k = a.k_proj(x).view(T, nkv, d).transpose(0, 1)  # (nkv, T, d)
    v = a.v_proj(x).view(T, nkv, d).transpose(0, 1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    kk, vv = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    s = q @ kk.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, -1) @ vv).transpose(0, 1).reshape(T, nh * d)
    h2 = h + a.o_proj(o)
    return k, v, h2 + layer.mlp(layer.post_attention_layernorm(h2))


def _head(model, h):
    return model.lm_head(model.model.norm(h))


@torch.inference_mode()
def ref_pass(model, ids, depths, decide=None):
    """Recompute the whole sequence. depths[t]: layers run at position t; the last position's
    depth may be None, then decide(n_layers_run, h_last, h_prev_exit) -> bool stops it there.
    Returns (per-layer (k, v), last position's depth, hidden state of the last position)."""
    cfg, L = model.config, len(model.model.layers)
    h = model.model.embed_tokens(torch.tensor(ids))  # (T, H)
    cos, sin = _rope(cfg, model.model.layers[0].self_attn.head_dim, len(ids))
    depths, kv, prev = list(depths), [], h[-1]
    for i, layer in enumerate(model.model.layers):
        k, v, new = _layer(layer, cfg, h, cos, sin)
        kv.append((k, v))
        active = torch.tensor([d is None or i < d for d in depths])[:, None]
        h = torch.where(active, new, h)
        if depths[-1] is None and i + 1 < L and decide is not None:
            if decide(i + 1, h[-1], prev):
                depths[-1] = i + 1
            prev = h[-1] if (i + 1) in decide.points else prev
    return kv, depths[-1] or L, h[-1]


class Rule:
    """The exit rule, restated: check at `points`, exit iff t < 1 and confidence >= t."""

    def __init__(self, model, points, thresholds, confidence):
        self.model, self.points, self.th, self.conf = model, points, dict(zip(points, thresholds)), confidence

    def __call__(self, n, h, prev):
        if n not in self.points or self.th[n] >= 1.0:
            return False
        if self.conf == "saturation":
            c = min(max(float(torch.nn.functional.cosine_similarity(h, prev, dim=0)), 0.0), 1.0)
        else:
            p = torch.softmax(_head(self.model, h), -1)
            top = torch.topk(p, 2).values
            c = float(top[0]) if self.conf == "softmax" else float(top[0] - top[1])
        return c >= self.th[n]


@torch.inference_mode()
def ref_early_exit(t, req, rule):
    """Slow early exit: a full recompute per token. Returns (tokens, exit layers, final kv, logits
    of a last full-depth step that feeds the last token)."""
    model, L = t.model, len(t.model.model.layers)
    key = prompt_key(req.seed, req.prompt_ids)
    ids, depths = list(req.prompt_ids), [L] * len(req.prompt_ids)
    tokens, layers = [], []
    while len(tokens) < req.max_new_tokens:
        # The last position's depth is decided by the rule; its hidden state stays frozen from
        # there. (For the first token the prompt runs full depth, but only the decision matters.)
        _, depth, h = ref_pass(model, ids, depths[:-1] + [None], rule)
        logits = _head(model, h)
        if tokens:
            depths[-1] = depth
        tok = int(choose(logits[None], req, key, [len(ids)])[0])
        tokens.append(tok)
        layers.append(depth)
        ids.append(tok)
        depths.append(None)
    depths[-1] = L
    kv, _, h = ref_pass(model, ids, depths)
    return tokens, layers, kv, _head(model, h)


def ee(t, **options):
    return EarlyExitDecoder(t, **options)


# ------------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_threshold_one_identical_to_standard(family, sampling, llama, qwen2):
    t = {"llama": llama, "qwen2": qwen2}[family]
    req = request(t, 24, **sampling)
    base = StandardDecoder(t).generate(req)
    with torch.inference_mode():
        scale = float(t.model(torch.tensor([req.prompt_ids])).logits.abs().max())
    for opts in ({"threshold": 1.0}, {"threshold": 1.0, "confidence": "saturation"},
                 {"threshold": [1.0, 1.0, 1.0], "exit_layers": [1, 3, 5]}):
        out = ee(t, **opts).generate(req)
        assert out.tokens == base.tokens
        assert out.stats["exit_layers"] == [LAYERS] * len(out.tokens)
        assert out.stats["lm_head_checks"] == 0 and out.stats["lm_head_evals"] == len(out.tokens)
        # A margin's rounding is relative to the logits it is the difference of.
        assert_close_scaled(out.margins, base.margins, scale=scale, layers=LAYERS + 1)


def test_threshold_one_never_fires_even_at_probability_one():
    plan = ExitPlan(4, (1, 2), (1.0, 0.0), "softmax")
    assert not plan.fires(0, 1.0) and not plan.enabled(0)
    assert plan.fires(1, 0.0)


def _truncated(t, depth):
    m = copy.deepcopy(t.model)
    m.model.layers = m.model.layers[:depth]
    return m


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("confidence", ["softmax", "saturation"])
def test_threshold_zero_equals_truncated_model(family, sampling, confidence, llama, qwen2):
    t = {"llama": llama, "qwen2": qwen2}[family]
    req = request(t, 12, **sampling)
    first = 2
    out = ee(t, threshold=0.0, exit_layers=[first, 4], confidence=confidence).generate(req)
    assert out.stats["exit_layers"] == [first] * len(out.tokens)
    # Reference: the model cut to its first `first` layers, full recompute each step, no cache.
    # State propagation never reaches its output (no later token runs deeper than `first`).
    m, key, ids, tokens = _truncated(t, first), prompt_key(req.seed, req.prompt_ids), list(req.prompt_ids), []
    with torch.inference_mode():
        for _ in range(req.max_new_tokens):
            logits = m(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1:]
            tokens.append(int(choose(logits, req, key, [len(ids)])[0]))
            ids.append(tokens[-1])
    assert list(out.tokens) == tokens


@pytest.mark.parametrize("family,confidence,threshold", [
    ("llama", "saturation", {2: 0.6, 4: 0.75}),
    ("qwen2", "saturation", {2: 0.6, 4: 0.75}),
    ("llama", "softmax", {1: 0.25, 3: 0.2}),
])
def test_propagated_kv_and_later_full_depth_logits_match_reference(family, confidence, threshold, llama, qwen2):
    t = {"llama": llama, "qwen2": qwen2}[family]
    req = request(t, 14)
    dec = ee(t, threshold=threshold, confidence=confidence)
    out, cache = dec.generate_with_cache(req)
    layers = out.stats["exit_layers"]
    assert any(l < LAYERS for l in layers[1:]) and LAYERS in layers[1:], f"want a mix of depths, got {layers}"
    # The reference runs in float64, so what is left is the decoder's own fp32 rounding.
    t64 = LoadedModel(t.name, copy.deepcopy(t.model).double(), t.tokenizer, t.device, torch.float64)
    points = sorted(threshold)
    rule = Rule(t64.model, points, [threshold[p] for p in points], confidence)
    ref_tokens, ref_layers, ref_kv, ref_logits = ref_early_exit(t64, req, rule)
    assert list(out.tokens) == ref_tokens
    assert layers == ref_layers
    # Feed the last token at full depth: it attends to every propagated entry.
    position = len(req.prompt_ids) + len(out.tokens) - 1
    logits = dec.adapter.forward(torch.tensor([[out.tokens[-1]]]), cache, position)
    # The bounds are fp32 epsilons of each tensor's largest entry per layer reached (keys reach
    # 5-9 in magnitude on these wide-init models, logits ~5), not one absolute number.
    for i, (k, v) in enumerate(ref_kv):
        for got, want in ((cache.layers[i].keys[0], k), (cache.layers[i].values[0], v)):
            assert_close_scaled(got, want, layers=i + 1)
    assert_close_scaled(logits[0], ref_logits, layers=LAYERS + 1)  # + the final norm and LM head


def test_skipped_layer_kv_is_the_copied_state_projection(llama):
    """Directly: after an exit at layer l, layer j >= l holds k/v of norm_j(h_l) with rotary."""
    t, l = llama, 2
    dec = ee(t, threshold=0.0, exit_layers=[l])
    req = request(t, 3)
    out, cache = dec.generate_with_cache(req)
    pos = len(req.prompt_ids) + 1                # the second new token's input position
    ids = list(req.prompt_ids) + list(out.tokens[:2])
    _, _, h_l = ref_pass(t.model, ids, [LAYERS] * (len(ids) - 2) + [l, l])
    cos, sin = _rope(t.model.config, t.model.model.layers[0].self_attn.head_dim, len(ids))
    for j in range(l, LAYERS):
        a = t.model.model.layers[j].self_attn
        x = t.model.model.layers[j].input_layernorm(h_l)
        k = a.k_proj(x).view(-1, a.head_dim) * cos[pos] + _rotate_half(a.k_proj(x).view(-1, a.head_dim)) * sin[pos]
        v = a.v_proj(x).view(-1, a.head_dim)
        # Both sides are fp32 through l layers and one projection, in different orders.
        assert_close_scaled(cache.layers[j].keys[0, :, pos], k, layers=l + 1)
        assert_close_scaled(cache.layers[j].values[0, :, pos], v, layers=l + 1)


class Scripted(EarlyExitDecoder):
    """Confidence comes from a script, one value per check, so the exits are known by hand."""

    def __init__(self, target, script, **kw):
        super().__init__(target, **kw)
        self.script = list(script)

    def _check(self, layer, last, previous):
        _, logits = super()._check(layer, last, previous)
        return self.script.pop(0), logits


def test_exit_histogram_and_average_by_hand(llama):
    # exits at 2, 4, 6 of 6 layers... with 6 layers the checkpoints are 2 and 4 (6 is the final).
    script = [0.9,            # token 0: exits at 2           (1 check)
              0.1, 0.2,       # token 1: full depth, 6        (2 checks)
              0.1, 0.7,       # token 2: exits at 4           (2 checks)
              0.5,            # token 3: exits at 2 (>= 0.5)  (1 check)
              0.49, 0.49]     # token 4: full depth           (2 checks)
    dec = Scripted(llama, script, threshold=0.5, exit_layers=[2, 4])
    out = dec.generate(request(llama, 5))
    s = out.stats
    assert s["exit_layers"] == [2, 6, 4, 2, 6]
    assert Counter(s["exit_layers"]) == {2: 2, 4: 1, 6: 2}
    assert s["avg_layers"] == pytest.approx(20 / 5)
    assert s["num_layers"] == 6
    assert s["lm_head_checks"] == 8 and s["lm_head_evals"] == 8 + 2
    assert s["exit_confidences"][:4] == [0.9, pytest.approx(s["exit_confidences"][1]), 0.7, 0.5]
    assert s["target_forwards"] == 5 and s["fallbacks"] == 0
    assert not dec.script


def test_stats_and_margins(llama):
    req = request(llama, 8)
    out = ee(llama, threshold=0.0).generate(req)
    s = out.stats
    assert s["exit_points"] == list(default_exit_layers(LAYERS)) and s["exit_layers"] == [1] * 8
    assert s["lm_head_checks"] == 8 and s["lm_head_evals"] == 8 and s["avg_layers"] == 1.0
    assert len(s["exit_confidences"]) == 8 and all(0 <= c <= 1 for c in s["exit_confidences"])
    m = _truncated(llama, 1)
    ids = list(req.prompt_ids)
    with torch.inference_mode():
        logits = m(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
    top = torch.topk(logits, 2).values
    assert out.margins[0] == pytest.approx(float(top[0] - top[1]),
                                           abs=tolerance(torch.float32, float(logits.abs().max()), layers=2))
    sat = ee(llama, threshold=0.0, confidence="saturation").generate(req).stats
    assert sat["lm_head_checks"] == 0 and sat["lm_head_evals"] == 8   # the cosine needs no head
    json.dumps(s)  # stats are plain JSON


def test_default_exit_layers():
    assert default_exit_layers(30) == (7, 14, 21, 28)
    assert default_exit_layers(4) == (1, 2, 3)
    assert default_exit_layers(6) == (1, 2, 3, 4, 5)
    assert default_exit_layers(8) == (2, 4, 6)


def test_per_layer_thresholds_forms():
    a = make_plan(8, threshold=[0.5, 0.9], exit_layers=[6, 2])
    assert a.exit_layers == (2, 6) and a.thresholds == (0.9, 0.5)   # paired as given, then sorted
    b = make_plan(8, threshold={"2": 0.3, 6: 0.8})
    assert b.exit_layers == (2, 6) and b.thresholds == (0.3, 0.8)
    c = make_plan(8, threshold="2:0.3,6:0.8")
    assert c == b
    assert make_plan(8, threshold="0.7").thresholds == (0.7, 0.7, 0.7)
    assert parse_threshold(0) == 0.0


@pytest.mark.parametrize("options,match", [
    ({"exit_layers": [0]}, r"outside \[1, 6\)"),
    ({"exit_layers": [6]}, r"outside \[1, 6\)"),
    ({"exit_layers": [-1, 2]}, r"outside"),
    ({"exit_layers": [2, 2]}, "twice"),
    ({"exit_layers": []}, "empty"),
    ({"exit_layers": ["x"]}, "integer"),
    ({"threshold": 1.5}, r"\[0, 1\]"),
    ({"threshold": -0.1}, r"\[0, 1\]"),
    ({"threshold": float("nan")}, r"\[0, 1\]"),
    ({"threshold": "high"}, r"\[0, 1\]"),
    ({"threshold": [0.5]}, "one per exit layer"),
    ({"threshold": {2: 0.5}, "exit_layers": [2, 4]}, "one threshold for each"),
    ({"threshold": "2:0.5,9:0.5"}, "outside"),
    ({"confidence": "entropy"}, "softmax, margin, saturation"),
    ({"k": 4}, "takes no option"),
])
def test_bad_options_raise(llama, options, match):
    with pytest.raises(DecoderError, match=match):
        ee(llama, **options)


def tiny_gpt2(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel
    from harness.models import tiny_tokenizer
    model = GPT2LMHeadModel(GPT2Config(vocab_size=259, n_positions=64, n_embd=32, n_layer=2, n_head=2))
    folder = tmp_path / "gpt2"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder, model


def test_unsupported_architecture_is_refused(tmp_path):
    from harness.models import LoadedModel, tiny_tokenizer
    _, model = tiny_gpt2(tmp_path)
    t = LoadedModel("gpt2", model, tiny_tokenizer(), torch.device("cpu"), torch.float32)
    with pytest.raises(DecoderError, match="gpt2"):
        ee(t)


# ----------------------------------------------------------------------------------- CLI

def _cli(*args):
    from harness.cli import main
    return main(["generate", "--target", "tiny-llama", "--decoder", "early-exit", "--prompt", "hi",
                 "--max-new-tokens", "4", "--json", *args])


@pytest.mark.parametrize("args", [
    ["--threshold", "1.5"], ["--threshold", "-0.2"], ["--threshold", "1:0.5,1:0.6"],
    ["--exit-layers", "4"], ["--exit-layers", "0"], ["--exit-layers", "a,b"],
    ["--exit-heads", "/nonexistent/heads"],
])
def test_cli_bad_input_exits_2(args, capsys):
    assert _cli(*args) == 2
    assert "error" in capsys.readouterr().err


def test_cli_unsupported_architecture_exits_2(tmp_path, capsys):
    from harness.cli import main
    folder, _ = tiny_gpt2(tmp_path)
    rc = main(["generate", "--target", str(folder), "--decoder", "early-exit", "--prompt", "hi", "--no-chat",
               "--max-new-tokens", "2"])
    assert rc == 2
    assert "gpt2" in capsys.readouterr().err


def test_cli_runs_with_per_layer_thresholds_and_heads(tmp_path, capsys):
    save_exit_heads(tmp_path / "heads", identity_heads(64, [1, 2]))
    assert _cli("--threshold", "1:0,2:0.5", "--exit-heads", str(tmp_path / "heads")) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["stats"]["exit_layers"] == [1] * len(row["tokens"])
    assert row["stats"]["exit_points"] == [1, 2] and row["stats"]["thresholds"] == [0.0, 0.5]


# ------------------------------------------------------------------------------ exit heads

def test_exit_heads_roundtrip_and_identity(tmp_path, llama):
    H = llama.model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    heads = {2: (0.05 * torch.randn(H, H, generator=g), 0.05 * torch.randn(H, generator=g)),
             4: (torch.zeros(H, H), torch.zeros(H))}
    folder = save_exit_heads(tmp_path / "h", heads, model="tiny-llama")
    meta = json.loads((folder / "exit_heads.json").read_text())
    assert meta == {"format": "decodegate-exit-heads", "version": 1, "hidden_size": H, "layers": [2, 4],
                    "model": "tiny-llama"}
    loaded = load_exit_heads(folder, num_layers=LAYERS, hidden_size=H)
    assert loaded.layers == (2, 4)
    torch.testing.assert_close(loaded.heads[2][0], heads[2][0])
    # Exit layers default to the heads' layers; the logits are lm_head(norm(h + h W^T + b)).
    dec = ee(llama, threshold=0.0, exit_heads=str(folder))
    assert dec.plan.exit_layers == (2, 4)
    h = torch.randn(1, 3, H, generator=g)
    want = _head(llama.model, h + h @ heads[2][0].T + heads[2][1])
    assert_close_scaled(dec.exit_logits(2, h), want[0], layers=2)  # the head, then the LM head
    # Zero heads reproduce the logit lens exactly.
    req = request(llama, 10)
    zero = save_exit_heads(tmp_path / "z", identity_heads(H, [2, 4]))
    for th in (0.0, {2: 0.3, 4: 0.2}):
        a = ee(llama, threshold=th, exit_heads=zero).generate(req)
        b = ee(llama, threshold=th, exit_layers=[2, 4]).generate(req)
        assert a.tokens == b.tokens and a.stats["exit_layers"] == b.stats["exit_layers"]
    # A real head changes what a layer-2 exit says.
    with_head = ee(llama, threshold=0.0, exit_heads=folder).generate(req)
    assert with_head.stats["exit_layers"] == [2] * 10


def _write(folder, meta=None, tensors=None):
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    base = {"format": "decodegate-exit-heads", "version": 1, "hidden_size": 64, "layers": [2]}
    (folder / "exit_heads.json").write_text(json.dumps({**base, **(meta or {})}))
    for layer, t in (tensors if tensors is not None else {2: {"weight": torch.zeros(64, 64),
                                                              "bias": torch.zeros(64)}}).items():
        save_file(t, str(folder / f"layer_{layer}.safetensors"))
    return folder


@pytest.mark.parametrize("meta,tensors,match", [
    ({"format": "tuned-lens"}, None, "format"),
    ({"version": 2}, None, "version"),
    ({"hidden_size": "64"}, None, "hidden_size"),
    ({"layers": []}, None, "non-empty"),
    ({"layers": [2, 2]}, None, "twice"),
    ({"layers": [2, 3]}, None, "layer_3.safetensors is missing"),
    (None, {2: {"weight": torch.zeros(64, 32), "bias": torch.zeros(64)}}, r"shape \(64, 32\)"),
    (None, {2: {"weight": torch.zeros(64, 64), "bias": torch.zeros(63)}}, r"shape \(63,\)"),
    (None, {2: {"weight": torch.zeros(64, 64)}}, "'weight' and 'bias'"),
    (None, {2: {"weight": torch.full((64, 64), float("nan")), "bias": torch.zeros(64)}}, "NaN"),
    (None, {2: {"weight": torch.zeros(64, 64, dtype=torch.int32), "bias": torch.zeros(64)}}, "floating"),
])
def test_exit_heads_loader_validates(tmp_path, meta, tensors, match):
    with pytest.raises(DecoderError, match=match):
        load_exit_heads(_write(tmp_path / "h", meta, tensors))


def test_exit_heads_must_fit_the_model(tmp_path, llama):
    with pytest.raises(DecoderError, match="hidden_size 32"):
        ee(llama, exit_heads=save_exit_heads(tmp_path / "a", identity_heads(32, [2])))
    with pytest.raises(DecoderError, match=r"outside \[1, 6\)"):
        ee(llama, exit_heads=save_exit_heads(tmp_path / "b", identity_heads(64, [6])))
    with pytest.raises(DecoderError, match="no exit head"):
        ee(llama, exit_heads=save_exit_heads(tmp_path / "c", identity_heads(64, [2])), exit_layers=[2, 4])
    with pytest.raises(DecoderError, match="no exit_heads.json"):
        (tmp_path / "empty").mkdir()
        ee(llama, exit_heads=tmp_path / "empty")


# ------------------------------------------------------------------------------ measurement

def test_ee_measure_runs_on_a_tiny_model(llama):
    from harness.exits import measure as ee_measure
    costs = ee_measure.measure_costs(llama, reps=2)
    results = ee_measure.run(llama, thresholds=[0.0], confidence="softmax", max_new_tokens=4, rounds=1,
                             prompts=ee_measure.PROMPTS[:2], log=lambda *a, **k: None)
    rows = {r["decoder"]: r for r in ee_measure.summarize(results, costs)}
    assert set(rows) == {"standard", "ee@1.0", "ee@0"}
    assert rows["ee@1.0"]["identical_prompts"] == 1.0 and rows["ee@1.0"]["avg_layers"] == LAYERS
    assert rows["ee@0"]["avg_layers"] == 1.0 and rows["ee@0"]["head_evals_per_token"] == 1.0
    assert "| ee@0 | 1.0 |" in ee_measure.format_table(list(rows.values()), costs)
