"""Calibrate early-exit thresholds with a guarantee: Learn-then-Test over a threshold grid.

    decodegate calibrate-exits --target smollm2-135m [--exit-heads DIR] --epsilon 0.1 --delta 0.1 --out CAL

The statement it certifies, for one global softmax-confidence threshold λ applied at every exit
layer (the heads' layers, or the default ones for the logit lens): with probability ≥ 1 − δ over
the calibration draw, the risk at λ is ≤ ε, where the risk is (--loss)
- `token` (default): the expected fraction of a sequence's tokens at which early exit picks
  another greedy token than full depth would, given the same full-depth prefix;
- `sequence`: the probability that at least one token of a sequence differs.
One loss per prompt (tokens of a sequence are not independent), so n counts prompts.

Data: the target's greedy continuations of the `calib` and `test` prompt splits of
`harness/exits/prompts.py` (disjoint from the heads' training prompts and from every suite's
items). The guarantee holds for prompts like the calibration split's; a suite of another kind
is a shift. Where the per-token outcomes come from (--estimate):
- `onepass` (default, fast): exit decisions read teacher-forced from one full-depth pass (the
  confidence and greedy token at each exit layer, through the heads), the whole grid at once.
  It leaves out state propagation: after an exit, later tokens attend to keys and values that
  the skipped layers computed from a copied state, which can change their choice. On a model not
  trained to exit this matters a lot (measured on smollm2-135m: 6% disagreement one-pass, 23%
  through the real decoder at the same threshold), so the guarantee is then about the one-pass
  quantity only; the decoder check below says how far the deployed decoder is from it.
- `decoder` (what deployment does, slow): the real early-exit decoder, teacher-forced on the
  same continuations, one grid point at a time in the testing order, stopping after the first
  point that cannot be certified (fixed-sequence testing never looks past it). The guarantee is
  then about the decoder itself.

Reported: the chosen threshold, ε, δ, n, the p-values along the grid; the held-out risk on the
`test` split (it should be ≤ ε); the same over several random re-splits of calib + test (how
often the held-out risk exceeds ε); and, with the real early-exit decoder (state propagation
into skipped layers, which the one-pass estimate leaves out), the held-out token disagreement at
the chosen threshold. A teacher-forced frontier (risk, mean layers, theoretical speedup per grid
point) comes with it. Output: CAL/exit_calibration.json, which `threshold = "calibrated:CAL"`
reads (in `regress`, `generate --threshold`, `bench --thresholds`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from harness.exits.ltt import CalibrationError, check_level, default_grid, learn_then_test, n_needed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m", help="target model (default: %(default)s)")
    p.add_argument("--exit-heads", help="exit heads folder (`decodegate train-exits`); default: none, the logit lens")
    p.add_argument("--layers", help="exit layers for the logit lens (default: the decoder's default; with heads: theirs)")
    p.add_argument("--epsilon", type=float, default=0.1, help="risk bound ε (default: %(default)s)")
    p.add_argument("--delta", type=float, default=0.1, help="error level δ: the bound holds with probability "
                                                            ">= 1 - δ (default: %(default)s)")
    p.add_argument("--loss", choices=("token", "sequence"), default="token",
                   help="token: fraction of a sequence's tokens that differ from full depth; sequence: any token "
                        "differs (default: %(default)s)")
    p.add_argument("--estimate", choices=("onepass", "decoder"), default="onepass",
                   help="onepass: exit decisions read from one full-depth pass, the whole grid at once (fast; "
                        "leaves out state propagation); decoder: the real early-exit decoder, teacher-forced, one "
                        "grid point at a time until the first uncertified one (what deployment does; slow) "
                        "(default: %(default)s)")
    p.add_argument("--grid", help="comma-separated thresholds, tested in the order given, safest (highest) first "
                                  "(default: 50 points from 0.999 down to 0.3, denser near 1)")
    p.add_argument("--calib-prompts", type=int, default=200, help="calibration prompts (default: %(default)s)")
    p.add_argument("--test-prompts", type=int, default=120, help="held-out prompts (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="per continuation (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=20, help="random re-splits of calib + test for the repeated "
                                                         "held-out check (default: %(default)s)")
    p.add_argument("--decoder-check-prompts", type=int, default=24,
                   help="held-out prompts run through the real early-exit decoder at the chosen threshold "
                        "(0 to skip; default: %(default)s)")
    p.add_argument("--out", required=True, help="folder for exit_calibration.json")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


# ------------------------------------------------------------------------------- exit features

@torch.no_grad()
def exit_features(lens, states, layers, heads=None, *, chunk: int = 512):
    """Per position: softmax confidence (N, L) and agreement with the final top-1 (N, L) at
    each exit layer, read through the heads when given (else the logit lens)."""
    from harness.exits.train import apply_head
    conf, agree = [], []
    for i in range(0, states.n, chunk):
        top = lens.logits(states.final[i:i + chunk]).argmax(-1)
        c_rows, a_rows = [], []
        for l in layers:
            h = states.layers[l][i:i + chunk]
            if heads is not None:
                h = apply_head(h, *heads.heads[l])
            logits = lens.logits(h).float()
            p = torch.softmax(logits, -1)
            c_rows.append(p.max(-1).values)
            a_rows.append(logits.argmax(-1) == top)
        conf.append(torch.stack(c_rows, 1))
        agree.append(torch.stack(a_rows, 1))
    return torch.cat(conf).numpy(), torch.cat(agree).numpy()


def token_outcomes(conf: np.ndarray, agree: np.ndarray, grid, layers, num_layers: int):
    """For each position and threshold: (loss (N, G), layers run (N, G), LM-head evaluations
    (N, G)), following the early-exit decoder's rule: exit at the first exit layer whose
    confidence is >= λ (λ < 1), else run every layer."""
    g = np.asarray(grid, dtype=float)
    fires = (conf[:, :, None] >= g[None, None, :]) & (g[None, None, :] < 1.0)        # (N, L, G)
    any_fire = fires.any(axis=1)                                                      # (N, G)
    first = np.where(any_fire, fires.argmax(axis=1), len(layers))                     # (N, G)
    agree_ext = np.concatenate([agree, np.ones((agree.shape[0], 1), bool)], axis=1)   # full depth agrees
    loss = ~np.take_along_axis(agree_ext, first, axis=1)
    depth = np.asarray(list(layers) + [num_layers])[first]
    evals = np.where(any_fire, first + 1, len(layers) + 1)   # softmax checks up to the exit (+ final head)
    return loss.astype(float), depth.astype(float), evals.astype(float)


def per_sequence(values: np.ndarray, owner: np.ndarray, how: str) -> np.ndarray:
    """(N, G) per position -> (S, G) per sequence: the mean (token) or the max (sequence)."""
    seqs = np.unique(owner)
    rows = [values[owner == s] for s in seqs]
    return np.stack([r.max(axis=0) if how == "sequence" else r.mean(axis=0) for r in rows])


# ------------------------------------------------------------------------------------ command

def _heads(args, target):
    if not args.exit_heads:
        return None
    from decoders.exit_heads import load_exit_heads, model_fingerprint
    heads = load_exit_heads(Path(args.exit_heads))
    cfg = target.model.config
    heads.check_fits(int(cfg.num_hidden_layers), int(cfg.hidden_size), fingerprint=model_fingerprint(target.model),
                     model_name=target.name)
    return heads


def _checked_settings(args):
    """The checked level, grid and prompt splits: (eps, delta, n needed, grid, calib prompts,
    test prompts); a CalibrationError names the argument that cannot work."""
    from harness.exits import prompts as P
    eps, delta = check_level(args.epsilon, "--epsilon"), check_level(args.delta, "--delta")
    need = n_needed(eps, delta)
    if args.calib_prompts < need:
        raise CalibrationError(f"--calib-prompts {args.calib_prompts} cannot certify epsilon={eps:g} at "
                               f"delta={delta:g}: it needs n >= {need} prompts (with no errors at all; more in practice)")
    if args.test_prompts < 1 or args.max_new_tokens < 1 or args.seeds < 0 or args.decoder_check_prompts < 0:
        raise CalibrationError("--test-prompts and --max-new-tokens must be >= 1; --seeds and "
                               "--decoder-check-prompts >= 0")
    grid = _parse_grid(args.grid) if args.grid else default_grid()
    calib_p, test_p = P.prompts("calib"), P.prompts("test")
    if args.calib_prompts > len(calib_p) or args.test_prompts > len(test_p):
        raise CalibrationError(f"the calib / test splits hold {len(calib_p)} / {len(test_p)} prompts; asked for "
                               f"{args.calib_prompts} / {args.test_prompts}")
    return eps, delta, need, grid, calib_p[:args.calib_prompts], test_p[:args.test_prompts]


def _parse_grid(text: str) -> tuple:
    """--grid as a tuple of thresholds in [0, 1), in the order given."""
    try:
        grid = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CalibrationError(f"--grid takes comma-separated numbers, got {text!r}") from None
    if not grid or any(not 0 <= x < 1 for x in grid):
        raise CalibrationError(f"--grid values must be in [0, 1), got {text!r}")
    return grid


def _exit_layers(args, target, num_layers):
    """(exit layers, heads on the target's device and dtype or None): the heads' layers, else
    --layers or the decoder's default ones for the logit lens."""
    from decoders.early_exit import default_exit_layers
    from harness.exits.train import parse_layers
    heads = _heads(args, target)
    if heads is None:
        return (parse_layers(args.layers, num_layers) if args.layers else default_exit_layers(num_layers)), None
    if args.layers:
        raise CalibrationError("--layers applies to the logit lens; with --exit-heads the heads' layers are used")
    param = next(target.model.parameters())
    return heads.layers, heads.to(device=param.device, dtype=param.dtype)


def _resplits(calib_l, test_l, grid, *, seeds, eps, delta, binary) -> list[dict]:
    """The same procedure over random re-splits of calib + test (sizes kept). With
    --estimate decoder only the grid points run exist, so a re-split stops there too."""
    pool = np.concatenate([calib_l, test_l])
    rng = np.random.default_rng(0)
    repeats = []
    for s in range(seeds):
        order = rng.permutation(len(pool))
        a, b = pool[order[:len(calib_l)]], pool[order[len(calib_l):]]
        r = learn_then_test(a, grid, epsilon=eps, delta=delta, binary=binary)
        held = float(b[:, r.index].mean()) if r.index is not None else 0.0
        repeats.append({"seed": s, "threshold": r.threshold, "held_out_risk": held, "exceeds_epsilon": held > eps})
    return repeats


def _frontier(feats, grid, num_layers, head_cost) -> list[dict]:
    """Per grid point, over calib + test: token disagreement, mean layers, LM-head evaluations per
    token and the theoretical speedup they imply."""
    frontier = []
    all_depth = np.concatenate([feats["calib"]["depth"], feats["test"]["depth"]])
    all_evals = np.concatenate([feats["calib"]["evals"], feats["test"]["evals"]])
    all_loss = np.concatenate([feats["calib"]["loss"], feats["test"]["loss"]])
    for k, lam in enumerate(grid):
        d, e = float(all_depth[:, k].mean()), float(all_evals[:, k].mean())
        frontier.append({"threshold": lam, "token_disagreement": float(all_loss[:, k].mean()), "mean_layers": d,
                         "lm_head_evals_per_token": e,
                         "theoretical_speedup": (num_layers + head_cost) / (d + e * head_cost)})
    return frontier


def _outcomes(args, target, layers, heads, grid, num_layers, calib_p, test_p, fp, *, eps, delta):
    """The target's greedy continuations of both splits and their per-token outcomes over the
    grid (--estimate): (outcomes per split, the grid points run, calib and test continuations)."""
    from harness.exits import data
    from harness.exits.train import Lens
    progress = not args.no_progress
    kw = dict(temperatures=(0.0,), max_new_tokens=args.max_new_tokens, fingerprint=fp, progress=progress)
    calib_c = data.continuations(target, calib_p, seed=11, **kw)
    test_c = data.continuations(target, test_p, seed=12, **kw)
    lens = Lens(target.model)
    if args.estimate == "onepass":
        feats = {name: _onepass(target, lens, heads, layers, grid, num_layers, conts, progress, name)
                 for name, conts in (("calib", calib_c), ("test", test_c))}
    else:
        feats = _decoder_grid(target, heads, layers, grid, num_layers, calib_c, test_c, progress,
                              eps=eps, delta=delta, how=args.loss)
        grid = grid[:feats["calib"]["loss"].shape[1]]   # fixed sequence: points past the first failure never run
    return feats, grid, calib_c, test_c


def run_calibration(args, *, log=print) -> dict:
    from decoders.early_exit import CALIBRATION_FORMAT
    from decoders.exit_heads import heads_hash, model_fingerprint
    from harness.build import get_model
    from harness.exits import data
    from harness.models import lm_head_cost_in_layers

    eps, delta, need, grid, calib_p, test_p = _checked_settings(args)
    t_start = time.perf_counter()
    target = get_model(args.target, args.device)
    num_layers = int(target.model.config.num_hidden_layers)
    fp = model_fingerprint(target.model)
    layers, heads = _exit_layers(args, target, num_layers)
    feats, grid, calib_c, test_c = _outcomes(args, target, layers, heads, grid, num_layers, calib_p, test_p, fp,
                                             eps=eps, delta=delta)
    how, binary = args.loss, args.loss == "sequence"
    calib_l = per_sequence(feats["calib"]["loss"], feats["calib"]["owner"], how)
    test_l = per_sequence(feats["test"]["loss"], feats["test"]["owner"], how)
    res = learn_then_test(calib_l, grid, epsilon=eps, delta=delta, binary=binary)
    j = res.index
    test_risk = float(test_l[:, j].mean()) if j is not None else 0.0
    repeats = _resplits(calib_l, test_l, grid, seeds=args.seeds, eps=eps, delta=delta, binary=binary)
    frontier = _frontier(feats, grid, num_layers, lm_head_cost_in_layers(target.model))
    decoder_check = None
    if args.decoder_check_prompts and j is not None and args.estimate == "onepass":
        decoder_check = _decoder_check(target, heads, layers, res.threshold, test_c[:args.decoder_check_prompts],
                                       not args.no_progress)
        decoder_check["exceeds_epsilon"] = (decoder_check["token_disagreement"] or 0.0) > eps
    result = {
        "format": CALIBRATION_FORMAT, "version": 1,
        "target": target.name, "target_fingerprint": fp, "num_layers": num_layers,
        "exit_heads": str(Path(args.exit_heads).expanduser().resolve()) if args.exit_heads else None,
        "heads_hash": heads_hash(heads) if heads is not None else None,
        "confidence": "softmax", "exit_layers": list(layers), "thresholds": {str(l): res.threshold for l in layers},
        "certified": j is not None, "epsilon": eps, "delta": delta, "n": res.n, "n_needed": need,
        "loss": how, "estimate": args.estimate,
        "method": "Learn-then-Test, fixed-sequence testing over the grid, "
                              + ("exact binomial p-values" if res.binary else "Hoeffding-Bentkus p-values"),
        "grid": list(grid), "risks": list(res.risks), "pvalues": list(res.pvalues), "grid_certified": res.certified,
        "held_out": {"n": int(len(test_l)), "risk": test_risk, "within_epsilon": test_risk <= eps,
                     "tokens": feats["test"]["tokens"]},
        "resplits": _resplit_summary(args.seeds, repeats),
        "decoder_check": decoder_check,
        "frontier": frontier,
        "data": {"source": "target's greedy continuations of the calib / test prompt splits (harness/exits/prompts.py)",
                 "calib_prompts": len(calib_p), "test_prompts": len(test_p), "max_new_tokens": args.max_new_tokens,
                 "calib_hash": data.data_hash(calib_c), "test_hash": data.data_hash(test_c),
                 "calib_tokens": feats["calib"]["tokens"]},
        "seconds": time.perf_counter() - t_start,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write(result, Path(args.out).expanduser())
    _warn(log, result, res)
    return result


def _resplit_summary(seeds: int, repeats: list[dict]) -> dict:
    held = [r["held_out_risk"] for r in repeats]
    return {"seeds": seeds, "exceeded": sum(r["exceeds_epsilon"] for r in repeats),
            "held_out_risk_mean": float(np.mean(held)) if repeats else None,
            "held_out_risk_max": float(np.max(held)) if repeats else None,
            "runs": repeats}


def _write(result: dict, out: Path) -> None:
    """CAL/exit_calibration.json written atomically (a reader never sees half a file); `out` is
    added to the result."""
    from decoders.early_exit import CALIBRATION_FILE
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".calibration-")
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, out / CALIBRATION_FILE)
    result["out"] = str(out)


def _warn(log, result: dict, res) -> None:
    """Warnings on stderr: the real decoder exceeds ε where the one-pass estimate did not, or no
    grid point was certified."""
    eps, delta, decoder_check = result["epsilon"], result["delta"], result["decoder_check"]
    if decoder_check and decoder_check["exceeds_epsilon"]:
        log(f"calibrate-exits: warning: through the real decoder (state propagation) the held-out token disagreement "
            f"at this threshold is {decoder_check['token_disagreement']:.3f} > epsilon {eps:g}: the one-pass guarantee "
            f"does not carry over to deployment here; calibrate with --estimate decoder", file=sys.stderr)
    if res.index is None:
        log(f"calibrate-exits: no threshold of the grid could be certified at epsilon={eps:g}, delta={delta:g} "
            f"(the safest has risk {res.risks[0]:.3f}, p={res.pvalues[0]:.3g}); the thresholds are 1.0: never exit",
            file=sys.stderr)


def _onepass(target, lens, heads, layers, grid, num_layers, conts, progress, name) -> dict:
    """Per-token outcomes over the whole grid from one full-depth pass (exit decisions read from
    full-depth hidden states: no state propagation)."""
    from harness.exits import data
    st = data.layer_states(target, conts, layers, progress=progress, desc=f"states ({name})")
    conf, agree = exit_features(lens, st, layers, heads)
    loss, depth, evals = token_outcomes(conf, agree, grid, layers, num_layers)
    return {"owner": st.sequence.numpy(), "loss": loss, "depth": depth, "evals": evals, "tokens": st.n}


class _Forced:
    """The real early-exit decoder, teacher-forced on greedy continuations: per token, does it
    pick another greedy token than full depth would at the same prefix (its own cache, with the
    state it propagated into skipped layers)? Full depth's choices come from one forward."""

    def __init__(self, target, heads, layers, conts):
        from decoders.adapter import LayerAdapter
        from decoders.common import new_cache
        self.target, self.heads, self.layers = target, heads, list(layers)
        self.conts = [c for c in conts if c.tokens]
        ad = LayerAdapter(target.model)
        self.tops = []
        for c in self.conts:
            ids = torch.tensor([list(c.prompt_ids) + list(c.tokens[:-1])], device=target.device)
            with torch.inference_mode():
                self.tops.append(ad.forward(ids, new_cache(target.model), 0)[len(c.prompt_ids) - 1:].argmax(-1).tolist())

    def column(self, threshold: float, *, progress: bool, desc: str) -> dict:
        """Per-token loss, layers run and LM-head evaluations at one threshold."""
        from tqdm import tqdm

        from decoders.early_exit import EarlyExitDecoder
        dec = EarlyExitDecoder(self.target, threshold={l: threshold for l in self.layers}, exit_heads=self.heads)
        loss, depth, evals, owner = [], [], [], []
        for i, (c, top) in enumerate(tqdm(list(zip(self.conts, self.tops)), desc=desc, unit="seq",
                                          disable=not progress, dynamic_ncols=True)):
            exits, chosen = dec.teacher_forced(c.prompt_ids, c.tokens)
            loss += [float(a != b) for a, b in zip(chosen, top)]
            depth += exits
            evals += [self.layers.index(e) + 1 if e in self.layers else len(self.layers) + 1 for e in exits]
            owner += [i] * len(exits)
        return {"loss": np.asarray(loss), "depth": np.asarray(depth, float), "evals": np.asarray(evals, float),
                "owner": np.asarray(owner)}


def _decoder_grid(target, heads, layers, grid, num_layers, calib_c, test_c, progress, *, eps, delta, how) -> dict:
    """Outcomes from the real decoder, one grid point at a time in the testing order, stopping
    after the first point LTT cannot certify on the calibration split (fixed-sequence testing
    never looks past it). The held-out split is run at the same points."""
    sides = {"calib": _Forced(target, heads, layers, calib_c), "test": _Forced(target, heads, layers, test_c)}
    cols = {name: [] for name in sides}
    for k, lam in enumerate(grid):
        for name, forced in sides.items():
            cols[name].append(forced.column(lam, progress=progress, desc=f"{name} @ {lam:.4g}"))
        stacked = np.stack([c["loss"] for c in cols["calib"]], 1)
        res = learn_then_test(per_sequence(stacked, cols["calib"][0]["owner"], how), grid[:k + 1],
                              epsilon=eps, delta=delta, binary=(how == "sequence"))
        if res.certified <= k:
            break
    return {name: {key: (np.stack([c[key] for c in cs], 1) if key != "owner" else cs[0]["owner"])
                   for key in ("loss", "depth", "evals", "owner")} | {"tokens": int(len(cs[0]["loss"]))}
            for name, cs in cols.items()}


def _decoder_check(target, heads, layers, threshold, conts, progress) -> dict:
    """The real decoder at the chosen threshold on held-out prompts (--estimate onepass)."""
    col = _Forced(target, heads, layers, conts).column(threshold, progress=progress, desc="decoder check")
    rates = [col["loss"][col["owner"] == i].mean() for i in np.unique(col["owner"])]
    return {"prompts": len(rates), "tokens": int(len(col["loss"])), "threshold": threshold,
            "token_disagreement": float(np.mean(rates)) if rates else None,
            "mean_layers": float(col["depth"].mean()) if len(col["depth"]) else None}


def table(r: dict) -> str:
    lines = [f"calibrated exits for {r['target']} ({'heads ' + r['exit_heads'] if r['exit_heads'] else 'logit lens'}), "
             f"exit layers {r['exit_layers']}, loss '{r['loss']}'",
             f"{r['method']}; outcomes from {'one full-depth pass' if r['estimate'] == 'onepass' else 'the real decoder'}; "
             f"epsilon={r['epsilon']:g}, delta={r['delta']:g}, n={r['n']} prompts "
             f"(n needed at zero loss: {r['n_needed']})"]
    th = next(iter(r["thresholds"].values()))
    if r["certified"]:
        lines.append(f"threshold {th:.4f} (grid points certified in sequence: {r['grid_certified']} of the "
                     f"{len(r['grid'])} {'in the grid' if r['estimate'] == 'onepass' else 'run'})")
    else:
        lines.append("threshold 1.0: nothing certified; early exit never fires")
    h = r["held_out"]
    lines.append(f"held out: risk {h['risk']:.4f} on n={h['n']} prompts ({'<=' if h['within_epsilon'] else '>'} "
                 f"epsilon {r['epsilon']:g})")
    rs = r["resplits"]
    if rs["seeds"]:
        lines.append(f"re-splits: held-out risk > epsilon in {rs['exceeded']} of {rs['seeds']} (mean "
                     f"{rs['held_out_risk_mean']:.4f}, max {rs['held_out_risk_max']:.4f})")
    if r["decoder_check"]:
        d = r["decoder_check"]
        lines.append(f"real decoder (state propagation), teacher-forced on {d['prompts']} held-out prompts: "
                     f"token disagreement {d['token_disagreement']:.4f}, mean layers {d['mean_layers']:.1f}/{r['num_layers']}")
    idx = [k for k, f in enumerate(r["frontier"]) if k % 7 == 0 or f["threshold"] == th]
    lines.append("teacher-forced frontier: threshold  disagreement  mean layers  theory speedup")
    for k in idx:
        f = r["frontier"][k]
        lines.append(f"  {f['threshold']:.4f}  {f['token_disagreement']:.4f}  {f['mean_layers']:.1f}  "
                     f"{f['theoretical_speedup']:.2f}x")
    lines.append(f"written to {r['out']}/exit_calibration.json; use threshold = \"calibrated:{r['out']}\"")
    return "\n".join(lines)


def run(args) -> int:
    result = run_calibration(args)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0
