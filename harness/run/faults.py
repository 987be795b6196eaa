"""When a decoder breaks: an exception, a result that is garbage, a death, a hang.

decodegate tests decoders that are new, and new decoders break. A break is the decoder's verdict,
never decodegate's crash, and nothing generated before it is lost. The stop rows, each with its
one line and a file in tracebacks/ of the run folder:
- `raised`: an exception on an item (taken where it was raised: harness.run.worker.exc_info),
  named with the innermost frame in the decoder's own code (file:line), or a broken
  `generate_many` contract;
- `crashed`: a worker that died on an item (exit status or signal, its stderr's last lines) or
  hung (`hung`), and `load_failed`: a decoder that raised while it was built;
- `garbage`: why a result cannot be judged (non-finite margins, a token id outside the
  vocabulary, more tokens than asked, a malformed result), or None: that item's error.
"""
from __future__ import annotations

import math
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the command line's error path imports this module without torch
    from harness.run.work import WorkItem

FATAL = "fatal.log"           # faulthandler's report of a native crash (and of the backstop timeout)
TRACEBACKS = "tracebacks"     # one file per broken decoder
BROKEN = ("raised", "crashed", "hung")  # stop reasons that fail a candidate (harness.verdict.gate)
HANG_FACTOR = 20.0            # an item may take this many times the baseline's time on it ...
HANG_FLOOR_S = 60.0           # ... and never less than this, before it counts as hung
# An item with nothing to scale by (the baseline's first, with no --item-timeout) is bounded all
# the same: a user's baseline that never answers would otherwise hold the run until CI's timeout.
UNKNOWN_ITEM_LIMIT_S = 1800.0
GRACE_S = 30.0                # faulthandler's own timeout after the watchdog's: a hang holding the GIL
HUNG_EXIT = 1                 # a hung run ends as a failed gate would (no verdict written)
_OURS = Path(__file__).resolve().parents[2]  # the decodegate checkout or install root
OUR_PACKAGES = ("harness", "decoders", "suites", "analysis")


@dataclass(frozen=True)
class Policy:
    """What the runner does when a decoder breaks (regress's options)."""
    keep_going: bool = False           # a candidate that raised goes on with its other items
    retry: bool = False                # run again a candidate that broke in an earlier run on the folder
    item_timeout: float | None = None  # seconds: an absolute bound on one item
    hang_factor: float = HANG_FACTOR   # times the baseline's wall time on the same item


def where(path: str) -> str:
    """A source file as a reader names it: relative to decodegate's root when inside it, else its name."""
    p = Path(path).resolve()
    return str(p.relative_to(_OURS)) if p.is_relative_to(_OURS) else p.name


def _own_files(decoder) -> Path | None:
    """The folder of the decoder class's top-level package (or its one file): its own code."""
    top = sys.modules.get(type(decoder).__module__.split(".")[0])
    paths = getattr(top, "__path__", None)
    if paths:
        return Path(list(paths)[0]).resolve()
    f = getattr(top, "__file__", None)
    return Path(f).resolve() if f else None


def is_ours(path: str) -> bool:
    p = Path(path).resolve()
    return any(p.is_relative_to(_OURS / pkg) for pkg in OUR_PACKAGES)


def _library(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path or path.startswith(sys.base_prefix) \
        or path.startswith("<")


def raised_at(exc: BaseException, decoder=None) -> tuple[str, bool]:
    """(file:line, ours): the innermost frame in the decoder's own code, else the innermost frame
    outside the standard library and installed packages; `ours` when that frame is decodegate's."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = _own_files(decoder) if decoder is not None else None
    pick = next((f for f in reversed(frames) if own and Path(f.filename).resolve().is_relative_to(own)), None)
    pick = pick or next((f for f in reversed(frames) if not _library(f.filename)), None) \
        or (frames[-1] if frames else None)
    if pick is None:
        return "?", False
    return f"{where(pick.filename)}:{pick.lineno}", is_ours(pick.filename)


def whose(exc: BaseException) -> str:
    """Whose code raised an exception that reached the command line: decodegate's, or code outside it
    (a user's decoder, grader or package) that decodegate called, named with its file:line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _library(f.filename)]
    if not frames:
        return "raised in a library"
    last = frames[-1]
    at = f"{where(last.filename)}:{last.lineno}"
    return f"a bug in decodegate, at {at}" if is_ours(last.filename) else f"raised by code outside decodegate, at {at}"


def item_label(w: WorkItem) -> str:
    return f"{w.suite.name}/{w.item.id} (T={w.temperature:g}, seed {w.seed})"


def raised(name: str, w: WorkItem, info: dict, run_dir: Path, ran: int, planned: int, fingerprint: dict) -> dict:
    """The stop row of a decoder that raised on an item (`info`: harness.run.worker.exc_info, taken
    where it raised): its one line, the item, the exception, and its traceback written to
    tracebacks/<name>.txt in the run folder. Out of memory (MemoryError, an allocator's refusal
    under the worker's cap) is a crash."""
    oom = info.get("out_of_memory")
    what = f"crashed (out of memory: {info['exception']})" if oom else f"raised {info['exception']}"
    line = f"{name}: {what} on {item_label(w)} at {info['at']}; {ran} of {planned} items ran"
    if info.get("contract"):
        line = f"{name}: broke the generate_many contract on {item_label(w)}: {info['message']}; {ran} of {planned} items ran"
    _write_trace(run_dir, name, line + "\n\n" + info["traceback"])
    return {"candidate": name, "suite": "*", "reason": "crashed" if oom else "raised", "detail": line,
            "item": f"{w.suite.name}/{w.item.id}", "seed": w.seed, "temperature": w.temperature,
            "exception": info["exception"], "message": info["message"], "at": info["at"], "ours": info["ours"],
            "traceback": f"{TRACEBACKS}/{name}.txt", "fingerprint": fingerprint}


def crashed(name: str, w: WorkItem | None, death, run_dir: Path, ran: int, planned: int, fingerprint: dict) -> dict:
    """The stop row of a decoder whose worker died or hung (`death`: harness.run.worker.Death) on
    an item, or (w None) failed to load: the line, and its stderr's last lines in the traceback file."""
    where = item_label(w) if w is not None else "load"
    verb = "hung" if death.hung else "crashed"
    line = f"{name}: {verb} on {where}: {death.how}; {ran} of {planned} items ran"
    lines = [x.strip() for x in death.tail.splitlines() if x.strip()]
    # faulthandler's report ends with a list of extension modules: its first line names the signal.
    last = next((x for x in lines if x.startswith("Fatal Python error")), lines[-1] if lines else "")
    if last and not death.hung:
        line += f"; its stderr ends: {last[:300]}"
    _write_trace(run_dir, name, f"{line}\n\nthe worker's last output:\n{death.tail or '(none)'}\n")
    row = {"candidate": name, "suite": "*", "reason": verb, "detail": line, "stderr": death.tail[-4000:],
           "traceback": f"{TRACEBACKS}/{name}.txt", "fingerprint": fingerprint}
    if w is not None:
        row.update(item=f"{w.suite.name}/{w.item.id}", seed=w.seed, temperature=w.temperature)
    return row


def load_failed(name: str, info: dict, run_dir: Path, fingerprint: dict) -> dict:
    """The stop row of a decoder that raised while it was built (its __init__, its draft's load)."""
    line = f"{name}: crashed on load: {info['exception']}: {info['message'].splitlines()[0] if info['message'] else ''}"
    line = line.rstrip(": ") + f" (at {info['at']})"
    _write_trace(run_dir, name, line + "\n\n" + info["traceback"])
    return {"candidate": name, "suite": "*", "reason": "crashed", "detail": line, "item": "load",
            "exception": info["exception"], "message": info["message"], "at": info["at"],
            "traceback": f"{TRACEBACKS}/{name}.txt", "fingerprint": fingerprint}


def _write_trace(run_dir: Path, name: str, body: str) -> None:
    folder = Path(run_dir) / TRACEBACKS
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.txt").write_text(body)


def garbage(result, request, vocab: int | None) -> str | None:
    """Why a decoder's result cannot be judged, or None. A number that is not finite, a token the
    model does not have or more tokens than asked would otherwise be graded as if measured."""
    for attr, kind in (("tokens", (list, tuple)), ("text", str), ("margins", (list, tuple)), ("stats", dict)):
        if not isinstance(getattr(result, attr, None), kind):
            return f"a malformed result ({type(result).__name__} without {attr!r} of the right type)"
    if not callable(getattr(getattr(result, "timing", None), "as_dict", None)):
        return f"a malformed result ({type(result).__name__} without a timing)"
    tokens = result.tokens
    for pos, t in enumerate(tokens):
        if not isinstance(t, int) or isinstance(t, bool):
            return f"token {pos} is {t!r} ({type(t).__name__}), not a token id"
        if t < 0 or (vocab is not None and t >= vocab):
            return f"token id {t} at position {pos} is outside the vocabulary (0..{vocab - 1 if vocab else '?'})"
    if len(tokens) > request.max_new_tokens:
        return f"{len(tokens)} tokens returned where at most {request.max_new_tokens} were asked"
    # An engine marks a margin it did not report with NaN (an accepted draft token has no
    # probabilities in llama.cpp's stream): "not reported", not garbage. In process every
    # margin is measured, so a NaN there is NaN logits.
    unreported_ok = "engine" in result.stats
    for pos, m in enumerate(result.margins):
        if m is None or (unreported_ok and isinstance(m, float) and math.isnan(m)):
            continue
        if not isinstance(m, (int, float)) or not math.isfinite(m):
            return f"margin {m!r} at position {pos} (NaN or infinite logits)"
    return None


def vocabulary(target) -> int | None:
    """The number of token ids the target has (its embedding rows, at least its tokenizer's size)."""
    sizes = [getattr(getattr(getattr(target, "model", None), "config", None), "vocab_size", None)]
    try:
        sizes.append(len(target.tokenizer))
    except (AttributeError, TypeError):
        pass
    sizes = [s for s in sizes if isinstance(s, int)]
    return max(sizes) if sizes else None


def item_limit(policy: Policy, baseline_wall: float | None) -> float | None:
    """Seconds one item may take: `hang_factor` times the baseline's time on it (at least
    HANG_FLOOR_S; for the baseline's own items, its slowest so far), and never more than
    `item_timeout`; UNKNOWN_ITEM_LIMIT_S where neither is known."""
    by_factor = max(HANG_FLOOR_S, policy.hang_factor * baseline_wall) if baseline_wall else None
    bounds = [b for b in (by_factor, policy.item_timeout) if b is not None]
    return min(bounds) if bounds else UNKNOWN_ITEM_LIMIT_S


def results(decoder, requests: list, keep_going: bool = False):
    """Yield `(index, result)` as `generate_many` does. An exception the decoder raises on an item
    (a DecoderError it yields, as always) comes as `(index, exception)` and ends the call, unless
    `keep_going`: then its other requests run in a new call. An engine's DecoderError that ends
    the call (the engine went down) is raised: that is the engine's, named by the engine."""
    from decoders.base import DecoderError
    left = list(range(len(requests)))
    while left:
        seen = []
        try:
            for j, result in decoder.generate_many([requests[i] for i in left]):
                seen.append(left[j])
                yield left[j], result
        except DecoderError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a decoder's bug raises is its verdict
            # In flight when it raised: the first request not answered (one by one, the one it was on).
            i = next((i for i in left if i not in seen), left[-1])
            seen.append(i)
            yield i, e
            if not keep_going:
                return
        left = [i for i in left if i not in seen]


class BaselineBroken(ValueError):
    """The baseline raised on an item: nothing is left to compare the candidates against."""
