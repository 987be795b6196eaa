"""Train exit heads for a target by distillation on the target itself (tuned lens, Belrose et
al. 2023), and write them in the `decoders.exit_heads` format.

    decodegate train-exits --target smollm2-135m [--layers 7,14,21,28] [--out DIR]

What it does, in order:
1. Text: the target's own greedy and sampled continuations of the `train` and `valid` prompt
   splits of `harness/exits/prompts.py` (templated prompts checked disjoint from every suite's
   evaluation items; see that module). Cached, so a rerun does not generate again.
2. Hidden states of the frozen target at the positions that decide each continuation token.
3. Heads T_l(h) = h + h W_l^T + b_l, one per exit layer, started from the least-squares map
   from h_l to the final-layer state (scaled to h_l's norm: the final norm ignores scale), then
   trained with Adam on KL(p_final || p_exit), p_x = softmax(lm_head(norm(x))). Only the heads
   train; the target stays frozen. Torch only.
4. Held-out report per layer on the `valid` split: KL and top-1 agreement with the final layer,
   for the logit lens (no head), the least-squares start and the trained head.
5. Output: the heads folder, with provenance in exit_heads.json (target name and fingerprint,
   data hash and source, steps, seed, the held-out report). Written to a temporary folder and
   renamed into place: a half-written folder is never loadable.

Interrupting (Ctrl-C) saves a checkpoint in a hidden folder beside --out (`.NAME.partial`, not a
heads folder); the same command resumes from it when target, data and settings match, and starts
over otherwise or with --restart. Training time is capped by --time-budget (seconds of
optimisation); the steps actually taken are recorded.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from decoders.base import DecoderError

PARTIAL = "checkpoint.pt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m", help="target model (default: %(default)s)")
    p.add_argument("--layers", help="comma-separated exit layers, counted as layers run, in [1, num_layers) "
                                    "(default: the early-exit decoder's default exit layers)")
    p.add_argument("--out", help="heads folder to write (default: <user cache>/decodegate/exit_heads/<target>-<fingerprint>)")
    p.add_argument("--prompts", type=int, default=240, help="training prompts (default: %(default)s; the split has "
                                                             "more, taken in a fixed order)")
    p.add_argument("--valid-prompts", type=int, default=48, help="held-out prompts for the report (default: %(default)s)")
    p.add_argument("--temperatures", default="0,0.7", help="one continuation per prompt and temperature; 0 is greedy "
                                                          "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="per continuation (default: %(default)s)")
    p.add_argument("--steps", type=int, default=300, help="Adam steps on the KL loss (default: %(default)s)")
    p.add_argument("--batch", type=int, default=256, help="token positions per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-4, help="peak Adam learning rate (default: %(default)s)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for the whole command: the KL steps get what generation, hidden states and the "
                        "final evaluation leave, and their schedule shrinks to fit (default: no limit)")
    p.add_argument("--init", choices=("lstsq", "zero"), default="lstsq",
                   help="start from the least-squares map or from zero (the logit lens) (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling and training seed (default: %(default)s)")
    p.add_argument("--restart", action="store_true", help="ignore a checkpoint of an interrupted run")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the held-out report as JSON")


@dataclass(frozen=True)
class Settings:
    layers: tuple[int, ...]
    prompts: int
    valid_prompts: int
    temperatures: tuple[float, ...]
    max_new_tokens: int
    steps: int
    batch: int
    lr: float
    init: str
    seed: int


# ------------------------------------------------------------------------------------ the loss

class Lens:
    """The target's frozen final norm and LM head, as functions of a hidden state (N, H)."""

    def __init__(self, model):
        self.norm = model.model.norm
        self.head = model.lm_head
        for p in list(self.norm.parameters()) + list(self.head.parameters()):
            p.requires_grad_(False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden))  # (N, V)


def kl_rows(logp_final: torch.Tensor, logits_exit: torch.Tensor) -> torch.Tensor:
    """KL(p_final || p_exit) per row: sum_v p (log p - log q). (N,)"""
    logq = torch.log_softmax(logits_exit.float(), dim=-1)
    return (logp_final.exp() * (logp_final - logq)).sum(-1)


def apply_head(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return h + torch.nn.functional.linear(h, weight, bias)   # T_l(h) = h + h W^T + b


def lstsq_head(h: torch.Tensor, final: torch.Tensor, ridge: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual affine map closest in least squares to the final state scaled to h's RMS
    (the final norm divides scale out, so any per-row scale of the target is allowed).
    Ridge relative to the mean eigenvalue keeps it stable on few rows."""
    h64, f64 = h.double(), final.double()
    scale = h64.pow(2).mean(-1, keepdim=True).sqrt() / f64.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
    y = f64 * scale - h64                                   # what the residual must add
    x = torch.cat([h64, torch.ones(h64.shape[0], 1, dtype=h64.dtype)], dim=1)  # (N, H+1)
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    coef = torch.linalg.solve(gram, x.T @ y)                # (H+1, H)
    return coef[:-1].T.float().contiguous(), coef[-1].float().contiguous()


@torch.no_grad()
def evaluate(lens: Lens, states, heads: dict[str, dict], *, chunk: int = 512) -> dict:
    """Per layer on held-out rows, in one pass: KL(final || exit) and top-1 agreement with the
    final layer for the logit lens and for each set of `heads` (name -> {layer: (W, b)})."""
    sums = {l: {f"{k}_{name}": 0.0 for name in ("lens", *heads) for k in ("kl", "agree")} for l in states.layers}
    for i in range(0, states.n, chunk):
        final_logits = lens.logits(states.final[i:i + chunk])
        logp = torch.log_softmax(final_logits.float(), -1)
        top = final_logits.argmax(-1)
        for l, h in states.layers.items():
            x = h[i:i + chunk]
            for name, logits in (("lens", lens.logits(x)),
                                 *((n, lens.logits(apply_head(x, *hs[l]))) for n, hs in heads.items())):
                sums[l][f"kl_{name}"] += float(kl_rows(logp, logits).sum())
                sums[l][f"agree_{name}"] += float((logits.argmax(-1) == top).sum())
    n = max(states.n, 1)
    return {"tokens": states.n, "layers": {str(l): {k: v / n for k, v in sums[l].items()} for l in sorted(sums)}}


# ----------------------------------------------------------------------------------- training

def planned_steps(settings, step: int, spent: float, time_budget: float | None, reserve_rows: int) -> int:
    """Steps the cosine schedule aims at: all of them, or, under a time budget, as many as the
    measured time per step lets fit (keeping room for `reserve_rows` rows of evaluation, about
    one step's cost per batch of rows). Re-estimated as steps go, so the rate still decays to 0."""
    if time_budget is None or step < 5:
        return settings.steps
    per_step = spent / step
    left = time_budget - spent - per_step * reserve_rows / settings.batch
    return min(settings.steps, step + max(0, int(left / per_step)))


def _lr(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def train(lens: Lens, states, settings: Settings, *, init_heads: dict, checkpoint: Path | None = None,
          resume: dict | None = None, time_budget: float | None = None, reserve_rows: int = 0,
          progress: bool = True, meta: dict | None = None) -> tuple[dict, int, float]:
    """Adam on sum_l mean KL(final || T_l) over random batches of rows. Returns (heads, steps
    done, seconds). `time_budget`: seconds for the steps (and `reserve_rows` of evaluation after
    them); the schedule shrinks to fit. Saves a checkpoint on interrupt (and every 50 steps)
    when given a path."""
    from tqdm import tqdm
    params, opt, gen, step, spent = _optimizer(settings, init_heads, resume)

    def save():
        _save_checkpoint(checkpoint, meta=meta, step=step, spent=spent, gen=gen, opt=opt, params=params)

    bar = tqdm(total=settings.steps, initial=step, desc="train-exits", unit="step", disable=not progress,
               dynamic_ncols=True)
    try:
        while step < planned_steps(settings, step, spent, time_budget, reserve_rows):
            t0 = time.perf_counter()
            lr = _lr(step, planned_steps(settings, step, spent, time_budget, reserve_rows), settings.lr)
            total = _train_step(lens, states, params, opt, gen, batch=settings.batch, lr=lr)
            step += 1
            spent += time.perf_counter() - t0
            bar.set_postfix_str(f"KL/layer {total / len(params):.3f}", refresh=False)
            bar.update(1)
            if checkpoint is not None and step % 50 == 0:
                save()
    except KeyboardInterrupt:
        save()
        bar.close()
        raise
    bar.close()
    return {l: (w.detach().clone(), b.detach().clone()) for l, (w, b) in params.items()}, step, spent


def _optimizer(settings: Settings, init_heads: dict, resume: dict | None):
    """(trainable heads per layer, Adam, batch generator, step, seconds spent), from the initial
    heads or where a checkpoint left off."""
    params = {l: (init_heads[l][0].clone().requires_grad_(True), init_heads[l][1].clone().requires_grad_(True))
              for l in settings.layers}
    flat = [t for pair in params.values() for t in pair]
    opt = torch.optim.Adam(flat, lr=settings.lr)
    gen = torch.Generator().manual_seed(settings.seed)
    step, spent = 0, 0.0
    if resume is not None:
        for l, (w, b) in resume["params"].items():
            params[int(l)][0].data.copy_(w)
            params[int(l)][1].data.copy_(b)
        opt.load_state_dict(resume["optimizer"])
        gen.set_state(resume["generator"])
        step, spent = int(resume["step"]), float(resume["seconds"])
    return params, opt, gen, step, spent


def _train_step(lens: Lens, states, params: dict, opt, gen, *, batch: int, lr: float) -> float:
    """One Adam step on a random batch of rows; returns the summed KL over the layers."""
    rows = torch.randint(0, states.n, (min(batch, states.n),), generator=gen)
    with torch.no_grad():
        logp = torch.log_softmax(lens.logits(states.final[rows]).float(), -1)   # (B, V)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for l, (w, b) in params.items():   # one layer at a time: one (B, V) graph alive
        loss = kl_rows(logp, lens.logits(apply_head(states.layers[l][rows], w, b))).mean()
        loss.backward()
        total += float(loss.detach())
    opt.step()
    return total


def _save_checkpoint(checkpoint: Path | None, *, meta, step: int, spent: float, gen, opt, params: dict) -> None:
    """The training state in checkpoint/PARTIAL, written whole or not at all (no checkpoint: nothing)."""
    if checkpoint is None:
        return
    checkpoint.mkdir(parents=True, exist_ok=True)
    tmp = checkpoint / (PARTIAL + ".tmp")
    torch.save({"meta": meta, "step": step, "seconds": spent, "generator": gen.get_state(),
                "optimizer": opt.state_dict(),
                "params": {l: (w.detach().clone(), b.detach().clone()) for l, (w, b) in params.items()}}, tmp)
    tmp.replace(checkpoint / PARTIAL)


# ---------------------------------------------------------------------------------- command

def default_out(target_name: str, fingerprint: str) -> Path:
    from harness.models import cache_dir
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in target_name)
    return cache_dir() / "exit_heads" / f"{safe}-{fingerprint}"


def parse_layers(text: str | None, num_layers: int) -> tuple[int, ...]:
    from decoders.early_exit import default_exit_layers
    if text is None:
        return default_exit_layers(num_layers)
    try:
        layers = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise DecoderError(f"--layers takes comma-separated integers, got {text!r}") from None
    bad = [l for l in layers if not 1 <= l < num_layers]
    if not layers or bad:
        raise DecoderError(f"--layers must name layers in [1, {num_layers}) for this target; got {text!r}")
    return tuple(layers)


def run_training(args, *, log=print) -> dict:
    """Everything `train-exits` does; returns the held-out report (also written to the heads)."""
    from decoders.exit_heads import model_fingerprint, save_exit_heads
    from harness.build import get_model

    temps = _checked_temperatures(args)
    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    target = get_model(args.target, args.device)
    cfg = target.model.config
    num_layers, hidden = int(cfg.num_hidden_layers), int(cfg.hidden_size)
    layers = parse_layers(args.layers, num_layers)
    fp = model_fingerprint(target.model)
    out = Path(args.out).expanduser() if args.out else default_out(target.name, fp)
    settings = Settings(layers, args.prompts, args.valid_prompts, temps, args.max_new_tokens, args.steps,
                        args.batch, args.lr, args.init, args.seed)
    d = _training_data(args, target, layers, temps, fp, log=log)

    lens = Lens(target.model)
    t0 = time.perf_counter()
    if args.init == "lstsq":
        init = {l: lstsq_head(d["train_s"].layers[l], d["train_s"].final) for l in layers}
    else:
        from decoders.exit_heads import identity_heads
        init = identity_heads(hidden, layers)
    t_init = time.perf_counter() - t0

    meta = {"target_fingerprint": fp, "data_hash": d["hash"], "settings": asdict(settings)}
    partial = out.parent / f".{out.name}.partial"
    resume = _resume_point(partial, meta, restart=args.restart, log=log)
    # --time-budget is for the whole command: the steps get what is left of it.
    budget_left = (None if args.time_budget is None else
                   args.time_budget - (time.perf_counter() - t_start) + (resume["seconds"] if resume else 0.0))
    heads, steps, t_train = train(lens, d["train_s"], settings, init_heads=init, checkpoint=partial, resume=resume,
                                  time_budget=budget_left, reserve_rows=d["valid_s"].n,
                                  progress=not args.no_progress, meta=meta)
    t0 = time.perf_counter()
    held_out = evaluate(lens, d["valid_s"], {"init": init, "head": heads})
    t_eval = time.perf_counter() - t0
    provenance = _provenance(args, target, fp, num_layers, temps, d, steps, resume, held_out)
    provenance["seconds"] = {"generation": d["t_gen"], "states": d["t_states"], "init": t_init, "train": t_train,
                             "eval": t_eval, "total": time.perf_counter() - t_start}
    from harness.commands.regress import code_version
    provenance["code_version"] = code_version()
    provenance["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save_exit_heads(out, heads, **provenance)
    shutil.rmtree(partial, ignore_errors=True)
    return {"out": str(out), **provenance}


def _checked_temperatures(args) -> tuple[float, ...]:
    """The sizes, rate and --temperatures checked; the temperatures parsed."""
    for name in ("prompts", "valid_prompts", "steps", "batch", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise DecoderError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.lr > 0:
        raise DecoderError(f"--lr must be > 0, got {args.lr}")
    try:
        temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
    except ValueError:
        raise DecoderError(f"--temperatures takes comma-separated numbers, got {args.temperatures!r}") from None
    if not temps or any(t < 0 for t in temps):
        raise DecoderError(f"--temperatures must be numbers >= 0, got {args.temperatures!r}")
    return temps


def _training_data(args, target, layers, temps, fp, *, log) -> dict:
    """The target's own continuations of the train and valid prompt splits and their hidden
    states at the exit layers, with the data hash and the seconds each stage took."""
    from harness.exits import data
    from harness.exits import prompts as P
    progress = not args.no_progress
    train_p, valid_p = P.prompts("train")[:args.prompts], P.prompts("valid")[:args.valid_prompts]
    gen_kw = dict(temperatures=temps, max_new_tokens=args.max_new_tokens, seed=args.seed, progress=progress,
                  fingerprint=fp)
    t0 = time.perf_counter()
    train_c = data.continuations(target, train_p, **gen_kw)
    valid_c = data.continuations(target, valid_p, **{**gen_kw, "seed": args.seed + 1})
    t_gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    train_s = data.layer_states(target, train_c, layers, progress=progress, desc="states (train)")
    valid_s = data.layer_states(target, valid_c, layers, progress=progress, desc="states (valid)")
    t_states = time.perf_counter() - t0
    dhash = data.data_hash(train_c)
    log(f"train-exits: {len(train_c)} continuations, {train_s.n} training positions, {valid_s.n} held out "
        f"(generation {t_gen:.0f} s, states {t_states:.0f} s)", file=sys.stderr)
    return {"train_p": train_p, "valid_p": valid_p, "train_c": train_c, "train_s": train_s, "valid_s": valid_s,
            "hash": dhash, "t_gen": t_gen, "t_states": t_states}


def _resume_point(partial: Path, meta: dict, *, restart: bool, log) -> dict | None:
    """The checkpoint to resume from: the one in `partial` if it was made with these settings and
    data (and --restart is not given), else None."""
    if not (partial / PARTIAL).is_file() or restart:
        return None
    ck = torch.load(partial / PARTIAL, weights_only=False)
    if ck.get("meta") == meta:
        log(f"train-exits: resuming from step {ck['step']} ({partial})", file=sys.stderr)
        return ck
    log(f"train-exits: a checkpoint in {partial} is for other settings or data; starting over", file=sys.stderr)
    return None


def _provenance(args, target, fp, num_layers, temps, d: dict, steps: int, resume, held_out) -> dict:
    """What the heads were trained on and how, and how they do on held-out rows (the caller adds
    the timings, the code version and the date)."""
    from harness.exits import prompts as P
    return {
        "target": target.name, "target_fingerprint": fp, "num_layers": num_layers,
        "data": {"source": "target's own continuations of templated prompts (harness/exits/prompts.py, "
                           "train split), checked disjoint from every suite's items",
                 "hash": d["hash"], "continuations": len(d["train_c"]), "positions": d["train_s"].n,
                 "temperatures": list(temps), "max_new_tokens": args.max_new_tokens,
                 "prompts": len(d["train_p"]), "valid_prompts": len(d["valid_p"]),
                 "suites_checked": P.check_disjoint()[1]["suites"],
                 "dropped_for_overlap": len(P.check_disjoint()[1]["dropped_for_overlap"])},
        "training": {"loss": "KL(final || exit)", "init": args.init, "steps": steps, "steps_asked": args.steps,
                     "time_budget": args.time_budget,
                     "batch": args.batch, "lr": args.lr, "optimizer": "Adam, warm-up then cosine", "seed": args.seed,
                     "resumed_from_step": int(resume["step"]) if resume else None},
        "held_out": held_out,
    }


def table(result: dict) -> str:
    lines = [f"exit heads for {result['target']} -> {result['out']}",
             f"{result['data']['positions']} training positions from {result['data']['continuations']} continuations; "
             f"{result['training']['steps']} steps; {result['seconds']['total']:.0f} s in all "
             f"(generation {result['seconds']['generation']:.0f} s, training {result['seconds']['train']:.0f} s)",
             f"held out ({result['held_out']['tokens']} positions): KL(final || exit) and agreement with the final layer's top-1",
             "layer  KL lens   KL lstsq  KL head   agree lens  agree lstsq  agree head"]
    for l, v in result["held_out"]["layers"].items():
        f = lambda x, spec: format(x, spec) if x is not None else "–"  # noqa: E731
        lines.append(f"{l:>5}  {v['kl_lens']:8.3f}  {f(v['kl_init'], '8.3f')}  {v['kl_head']:8.3f}  "
                     f"{v['agree_lens']:10.1%}  {f(v['agree_init'], '11.1%')}  {v['agree_head']:10.1%}")
    return "\n".join(lines)


def run(args) -> int:
    result = run_training(args)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0
