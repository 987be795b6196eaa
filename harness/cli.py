"""`decodegate` command line. Each subcommand lives in its own module with
`add_arguments(parser)` and `run(args) -> int`; heavy imports happen inside `run`.

Exit codes: 0 success / every gate passed, 1 a gate failed, 2 a usage or input error,
3 an internal error (a bug: the traceback is printed).
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "generate": ("harness.commands.generate", "generate one completion with a chosen decoder"),
    "regress": ("harness.commands.regress", "run baseline vs candidates on the suites, gate the result"),
    "bench": ("harness.commands.bench", "speed side by side: our decoders vs transformers, vs theory"),
    "suites": ("suites.cli", "list or show the prompt suites"),
    "sync": ("harness.commands.sync", "upload a run folder to MLflow (after the server was down)"),
    "history": ("harness.commands.history", "α, τ, speedup, identity and verdicts over the last runs in MLflow"),
    "lm-eval": ("harness.commands.lmeval", "run lm-eval tasks through decodegate's decoders"),
    "train-exits": ("harness.exits.train", "train exit heads for a target (distillation on its own text)"),
    "calibrate-exits": ("harness.exits.calibrate", "early-exit thresholds with a guarantee (Learn-then-Test)"),
    "estimate-acceptance": ("harness.commands.estimate", "teacher-forced α̂ of a draft on a suite, and the speedup it implies"),
    "watch": ("harness.commands.watch", "watch a live engine's acceptance against the verdict's; alarm on a drop"),
    "export-monitoring": ("harness.commands.monitoring", "Prometheus alert rules and a Grafana dashboard from a run's acceptance"),
    "exit-frontier": ("harness.exits.frontier", "early-exit threshold sweep: speed against quality, Pareto figure"),
    "config-schema": ("harness.commands.config_schema", "print the regress config's JSON Schema (editors validate with it)"),
}

def is_input_error(exc: BaseException) -> bool:
    """A missing file, or one of our input errors (ValueError subclasses defined in our packages)."""
    from harness.run.worker import is_input_error as ours
    return isinstance(exc, (FileNotFoundError, IsADirectoryError)) or ours(exc)


# Said under every subcommand's --help (a CI script is written from there, not from the top-level help).
EXIT_CODES = ("exit codes: 0 {ok}, 2 a usage or input error (one line naming it), 3 an internal error (a bug: "
              "the traceback is printed)")
GATE_EXIT_CODES = EXIT_CODES.format(ok="every gate passed, 1 a gate failed")


def _exit_codes(parser: argparse.ArgumentParser, name: str) -> None:
    """Give `parser` and the subcommands under it the exit codes as their epilog."""
    if parser.epilog is None:
        parser.epilog = GATE_EXIT_CODES if name == "regress" else EXIT_CODES.format(ok="done")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                _exit_codes(sub, sub_name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decodegate",
        description="Quality-regression and A/B evaluation harness for decoding optimizations "
                    "(speculative decoding, early exit). Exit codes: 0 pass, 1 a gate failed, 2 usage or input "
                    "error, 3 internal error.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue  # not built yet
            raise
        if name == "suites" and hasattr(mod, "register"):
            _exit_codes(mod.register(sub), name)
            continue
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
        if name != "lm-eval":  # its --help is lm-eval's own
            _exit_codes(p, name)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None) or getattr(args, "func", None)
    if run is None:
        parser.print_help()
        return 2
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        print("decodegate: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - input errors become one line and exit 2
        if is_input_error(e):
            print(f"decodegate: error: {_text(e)}", file=sys.stderr)
            return 2
        # Never exit 1 on a crash: CI would read it as "a gate failed".
        import traceback
        try:
            traceback.print_exc()
        except Exception:  # noqa: BLE001 - an exception whose __str__ raises
            pass
        from harness.run.faults import whose
        print(f"decodegate: internal error: {type(e).__name__}: {_text(e)} ({whose(e)})", file=sys.stderr)
        return 3
    except BaseException as e:  # noqa: BLE001 - SystemExit and its kin: never their code, never a pass
        from harness.run.faults import whose
        print(f"decodegate: internal error: {type(e).__name__}({_text(e)}) escaped the command, no verdict "
              f"({whose(e)})", file=sys.stderr)
        return 3


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001
        return f"<{type(e).__name__} whose str() raised>"


if __name__ == "__main__":
    sys.exit(main())
