"""Generate one completion for a prompt with a chosen decoder; `--json` prints one object with
tokens, text, decoder, stats and timing (the stable interface other tools read)."""
from __future__ import annotations

import argparse
import json
import sys

STATS_DEFAULTS = {"target_forwards": 0, "draft_forwards": 0, "proposed": 0, "accepted": 0,
                  "exit_layers": [], "fallbacks": 0}


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m",
                   help="model: alias (smollm2-135m, smollm2-135m-int8, tiny-llama, tiny-qwen2, tiny-mistral), "
                        "a local folder, a .gguf file, or a Hugging Face id (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")


def _threshold_arg(text: str):
    """A number, or the per-layer form "7:0.8,14:0.9" passed on as text (the early-exit
    backend parses and range-checks it, so a bad value is an input error, exit 2)."""
    try:
        return float(text)
    except ValueError:
        return text


def add_decoder_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoder")
    g.add_argument("--decoder", default="standard",
                   help="standard | speculative | early-exit | hf | hf-assisted | llama.cpp | vllm | sglang | openai | "
                        "openai-chat | package.module:Class (default: %(default)s)")
    g.add_argument("--draft", help="speculative / hf-assisted draft: a model, 'prompt-lookup', "
                                   "or 'self:L' (the target's first L layers)")
    g.add_argument("--draft-device", help="device of a draft model (default: the target's)")
    g.add_argument("--k", type=int, help="draft length K (default 4)")
    g.add_argument("--verify", choices=["rejection", "coupled"],
                   help="sampling verifier for speculative (default rejection: same distribution; coupled: "
                        "token-identical to standard with the same seed). Greedy requests verify by argmax")
    g.add_argument("--adaptive-k", action="store_true", default=None, help="grow/shrink K with acceptance")
    g.add_argument("--min-acceptance", type=float,
                   help="kill switch: fall back to standard decoding when rolling acceptance < X")
    g.add_argument("--threshold", type=_threshold_arg,
                   help="early-exit confidence threshold in [0, 1] (1 never exits), or one per exit "
                        "layer as LAYER:X pairs, e.g. 7:0.8,14:0.9")
    g.add_argument("--exit-layers", help="early-exit layers, comma separated (default: every few)")
    g.add_argument("--confidence", choices=["softmax", "margin", "saturation"],
                   help="early-exit confidence measure")
    g.add_argument("--exit-heads", help="early-exit: folder of per-layer exit heads "
                                        "(decodegate-exit-heads format; default: the shared LM head)")
    g.add_argument("--base-url", help="engine decoders (llama.cpp, vllm, sglang, openai, openai-chat): "
                                      "the URL of a running engine, e.g. http://127.0.0.1:8080")
    g.add_argument("--engine-model", help="engine decoders: the model name the engine must serve (checked)")


def decoder_options(args) -> dict:
    opts = {"draft": args.draft, "draft_device": args.draft_device, "k": args.k, "verify": args.verify,
            "adaptive_k": args.adaptive_k, "min_acceptance": args.min_acceptance,
            "threshold": args.threshold, "confidence": args.confidence,
            "exit_heads": getattr(args, "exit_heads", None),
            "base_url": getattr(args, "base_url", None), "model": getattr(args, "engine_model", None)}
    if args.exit_layers:
        try:
            opts["exit_layers"] = [int(x) for x in args.exit_layers.split(",")]
        except ValueError:
            from decoders.base import DecoderError  # an input error: exit 2 through cli.main
            raise DecoderError(f"--exit-layers must be integers like 4,8,12, got {args.exit_layers!r}") from None
    return {k: v for k, v in opts.items() if v is not None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_decoder_arguments(p)
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 disables (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 disables (default)")
    g.add_argument("--seed", type=int, default=0, help="keys the sampling noise (default 0)")
    g.add_argument("--max-new-tokens", type=int, default=64, help="new-token budget (default: %(default)s)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--prompt", required=True, help="the user message (or raw text with --no-chat)")
    p.add_argument("--chat", dest="chat", action="store_true", default=None,
                   help="apply the model's chat template (default when it has one)")
    p.add_argument("--no-chat", dest="chat", action="store_false", help="send the prompt as raw text")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from decoders import GenerationRequest
    from decoders.base import DecoderError
    from harness.build import build_decoder, get_model

    if not args.prompt.strip():
        raise DecoderError("prompt is empty")
    # Validate the request before loading anything heavy.
    if any(not s for s in args.stop):  # "" is in every text: suite files refuse it too
        raise DecoderError("--stop must not be empty")
    probe = GenerationRequest((0,), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p)
    del probe
    from decoders import get_decoder_class
    get_decoder_class(args.decoder)
    target = get_model(args.target, args.device)
    decoder = build_decoder(args.decoder, target, decoder_options(args))
    ids = target.encode(args.prompt, chat=args.chat)
    request = GenerationRequest(
        tuple(ids), max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, stop_token_ids=target.stop_token_ids(), stop_strings=tuple(args.stop), seed=args.seed)
    result = decoder.generate(request)
    if args.json:
        row = result.as_dict()
        row["stats"] = {**STATS_DEFAULTS, **row["stats"]}
        row.update(target=target.name, prompt_tokens=len(ids))
        json.dump(row, sys.stdout)
        print()
    else:
        print(result.text)
        t = result.timing
        print(f"[{args.decoder}: {len(result.tokens)} tokens, {result.finish_reason}, "
              f"{len(result.tokens) / max(t.wall_s, 1e-9):.1f} tok/s, ttft {t.ttft_s * 1000:.0f} ms]", file=sys.stderr)
    return 0
