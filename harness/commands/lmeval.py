"""Run lm-eval with decodegate's decoders: `decodegate lm-eval [lm-eval's own arguments]`.

This registers the `decodegate` lm-eval model (see `harness.run.lmeval`) and hands every remaining
argument to lm-eval's command line unchanged; `--model decodegate` is added when no --model is
given (and no --config). Example (needs the internet for gsm8k's data):

    decodegate lm-eval --model decodegate \\
        --model_args target=smollm2-135m,decoder=speculative,draft=prompt-lookup,k=4 \\
        --tasks gsm8k --limit 50

`decodegate lm-eval --help` shows lm-eval's help. Bad input (an unknown task, model arg or
model, task data that is neither cached nor reachable) exits 2 with one line.
"""
from __future__ import annotations

import argparse
import sys
import traceback

LMEVAL_SUBCOMMANDS = ("run", "ls", "validate")
# lm-eval's own input validation lives here; a ValueError/KeyError raised from these is bad input.
_INPUT_LAYERS = ("/lm_eval/_cli/", "/lm_eval/config/", "/lm_eval/api/registry.py",
                 "/lm_eval/tasks/manager.py")
# Where a task's data is fetched: a ConnectionError raised there is missing data, not a bug.
_DATA_LAYERS = ("/datasets/load.py",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Everything after `lm-eval` belongs to lm-eval, options included. argparse would claim
    # `--model` as an unknown option of ours before REMAINDER sees it, so this parser does not
    # treat any string as an option (its -h too goes through to lm-eval's help).
    p.prefix_chars = "\0"
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="lm-eval's arguments, e.g. --model_args target=...,decoder=... --tasks gsm8k")


def lmeval_argv(rest: list[str]) -> list[str]:
    """lm-eval's argv (without the program name): `run` and `--model decodegate` filled in."""
    argv = list(rest)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        return ["run", "--help"] if argv else ["--help"]
    if argv[0] not in LMEVAL_SUBCOMMANDS:
        argv = ["run", *argv]
    named = ("--model", "-M", "--config", "-C")  # a --config file may name the model itself
    if argv[0] == "run" and not any(a in named or a.startswith(("--model=", "--config=")) for a in argv):
        argv[1:1] = ["--model", "decodegate"]
    return argv


def run(args) -> int:
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    from harness.run.lmeval import LmEvalError  # importing it registers the "decodegate" model

    argv = lmeval_argv(args.rest)
    setup_logging()
    cli = HarnessCLI()
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # HarnessCLI.parse_args reads sys.argv
    try:
        cli.execute(cli.parse_args())
    except SystemExit as e:  # lm-eval's argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except (ValueError, KeyError) as e:
        if isinstance(e, LmEvalError) or not _from_input_layer(e):
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise LmEvalError(f"lm-eval: {message}") from e
    except ConnectionError as e:  # `datasets` could not fetch a task's data (offline, no cached copy)
        if not _from_layer(e, _DATA_LAYERS):
            raise
        raise LmEvalError(f"lm-eval: a task's data could not be loaded ({e}): it must be in the Hugging Face "
                          f"datasets cache or reachable over the network") from e
    finally:
        sys.argv = saved
    return 0


def _from_input_layer(exc: BaseException) -> bool:
    return _from_layer(exc, _INPUT_LAYERS)


def _from_layer(exc: BaseException, layers: tuple[str, ...]) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and any(part in frames[-1].filename.replace("\\", "/") for part in layers)
