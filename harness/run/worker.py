"""Decoders behind a process boundary: one worker process per decoder, for a whole run.

A decoder under test may raise, exit, segfault, be killed, hang (holding the GIL or not), leak a
thread or eat the machine's memory. None of that may end, stall or fool the process that writes
the run folder and sets the exit code. So the baseline and each candidate generate in a worker
process of their own, and the parent (harness.run.runner) alone writes records, judges and exits:

- `Worker(name, build)` forks the process before the parent loads any model (a fork is cheap, and
  it is taken while the parent has run no OpenMP region and touched no GPU, the two things a
  forked child cannot inherit; where CUDA is already up it spawns instead). The worker loads the
  target and builds the decoder itself, then answers "ready" or the failure to load.
- `Worker.run(requests, limit)` sends a block of requests and yields what comes back, one event
  per request: a result as plain JSON text (numpy and torch scalars converted in the worker,
  anything else refused as garbage), a per-item DecoderError, or the end of the call: the decoder
  raised (any BaseException, SystemExit and KeyboardInterrupt included, with its file:line and
  traceback), broke the `generate_many` contract, died (exit status or signal, the last lines of
  its stderr), or went past `limit` seconds (its Python stack is dumped, then it is killed).
- In the worker: Ctrl-C is ignored (it is the parent's), stdout and stderr go to a file whose
  tail names a death, the worker dies with the parent (PR_SET_PDEATHSIG), `memory` caps its
  address space (RLIMIT_AS, beyond what it inherited), and it ends by `os._exit`, so a leaked
  thread cannot hold it open. Speed is measured inside the worker, as in process.
- The decoder itself runs two processes down (harness.run.namespaces), in a PID namespace of its own where the
  kernel gives one, with the run folder read-only in a mount namespace: it cannot name, so cannot
  signal, decodegate, nor erase its own death from the folder. The process the parent started
  ends as the decoder's ended (exit status or signal), so a death reads the same either way.
Engine decoders (HTTP clients of a server decodegate started) stay in process: they run no code
of the user's, and their failures are already exceptions naming the engine.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

from harness.run.faults import OUR_PACKAGES, raised_at
from harness.run.namespaces import behind

_PARENT_ENDS: list = []        # the parent's ends of every live worker's pipe (closed in each new worker)
LOAD_LIMIT_S = 1800.0          # a decoder's load (target and draft weights, its __init__): past this it hung
MESSAGE_LIMIT = 256 * 2 ** 20  # bytes: a result larger than this is no generation of a suite's item
STACK_WAIT_S = 2.0             # how long a hung worker gets to write its Python stack before SIGKILL
TAIL_LINES = 12                # lines of a worker's stderr read by default
MEMORY_WORDS = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "bad_alloc", "out of memory")


@dataclass(frozen=True)
class Death:
    """How a worker ended without answering: `how` is one line ("killed by SIGSEGV", "exited
    with status 0", "no result after 3 s"), `tail` the last lines of its stderr."""
    how: str
    tail: str
    hung: bool = False
    out_of_memory: bool = False


def text(obj) -> str:
    """str(obj), even for an exception whose __str__ raises."""
    try:
        return str(obj)
    except BaseException as e:  # noqa: BLE001 - a decoder's object: anything may come out
        return f"<{type(obj).__name__} whose str() raised {type(e).__name__}>"


def exc_info(exc: BaseException, decoder=None) -> dict:
    """A decoder's exception as plain data: type, one-line message, file:line (in the decoder's own
    code where it has a frame there), whether that frame is decodegate's, and the traceback."""
    try:
        at, ours = raised_at(exc, decoder)
    except Exception:  # noqa: BLE001
        at, ours = "?", False
    try:
        trace = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        trace = "".join(traceback.format_tb(exc.__traceback__)) + f"{type(exc).__name__}: {text(exc)}\n"
    return {"exception": type(exc).__name__, "message": text(exc)[:2000], "at": at, "ours": ours,
            "traceback": trace, "out_of_memory": isinstance(exc, MemoryError)
            or any(w in text(exc) for w in MEMORY_WORDS[1:])}


def is_input_error(exc: BaseException) -> bool:
    """A bad option or model name (DecoderError, ConfigError, ModelError): the config's fault."""
    return isinstance(exc, ValueError) and type(exc).__module__.split(".")[0] in OUR_PACKAGES


# ------------------------------------------------------------------------------- the worker side


def _isolate(stderr_path: str, memory: float | None) -> None:
    """What makes the worker a boundary: its own output file, no Ctrl-C, death with the parent,
    a stack dump on SIGUSR1 (even while the GIL is held), and its memory cap."""
    import faulthandler
    import gc
    gc.freeze()  # the parent's objects, as forked: a collection here must not touch (and copy) their pages
    for conn in _PARENT_ENDS:
        conn.close()
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setpgid(0, 0)  # a group of its own: what the decoder forks (PDEATHSIG is not inherited) ends with it
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the parent
    except (OSError, AttributeError):
        pass
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    if memory:
        import resource
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        cap = mapped + int(memory * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _serve(conn, build: tuple, memory: float | None, stderr_path: str, protect: tuple = ()) -> None:
    """The worker's whole life: isolate, load, answer blocks of requests until told to stop."""
    _isolate(stderr_path, memory)
    behind(conn, protect)
    try:
        from harness.build import build_decoder, get_model
        target_spec, device, name, options = build
        decoder = build_decoder(name, get_model(target_spec, device), options)
    except BaseException as e:  # noqa: BLE001 - a failed load is that decoder's verdict
        _send(conn, ("load-failed", {**exc_info(e), "input_error": is_input_error(e)}))
        _leave()
    _send(conn, ("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            _leave()
        if msg[0] != "generate":
            _leave()
        _generate(conn, decoder, msg[1])


def _leave() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit, no join: a leaked thread cannot keep the worker alive


def _send(conn, msg) -> None:
    # JSON, never a pickle: the parent unpickling what a decoder can write on this pipe would run
    # any callable the decoder names, in the parent (the parent reads it with `protocol`).
    try:
        conn.send_bytes(json.dumps(msg).encode())
    except (OSError, ValueError):  # the parent is gone
        _leave()


def _generate(conn, decoder, requests: list) -> None:
    """Run `generate_many` over the requests, each index's answer sent once; a DecoderError that
    ends the call fails the request in flight only, and the rest run in a new call. Ends with
    one of "done", "raised" or "contract"."""
    from decoders.base import DecoderError
    left = list(range(len(requests)))
    while left:
        seen: list[int] = []
        try:
            for j, result in decoder.generate_many([requests[i] for i in left]):
                if not (isinstance(j, int) and 0 <= j < len(left)) or left[j] in seen:
                    what = "twice" if isinstance(j, int) and 0 <= j < len(left) else f"of {len(left)} requests"
                    return _send(conn, ("contract", left[j] if what == "twice" else _first(left, seen),
                                        f"generate_many yielded index {text(j)[:40]} {what}"))
                seen.append(left[j])
                _send(conn, _answer(left[j], result, DecoderError))
        except DecoderError as e:
            if (i := _first(left, seen)) is not None:
                seen.append(i)
                _send(conn, ("item-error", i, text(e)))
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the decoder's
            return _send(conn, ("raised", _first(left, seen), exc_info(e, decoder)))
        else:
            if len(seen) < len(left):
                return _send(conn, ("contract", _first(left, seen), f"generate_many ended with no result for "
                                                                     f"{len(left) - len(seen)} of its {len(left)} requests"))
        left = [i for i in left if i not in seen]
    _send(conn, ("done",))


def _first(left: list, seen: list):
    """The request in flight: the first one not answered (None once all are)."""
    return next((i for i in left if i not in seen), None)


def _answer(i: int, result, decoder_error) -> tuple:
    """One request's answer as a message: plain JSON text, a DecoderError's line, or why it is garbage."""
    if isinstance(result, decoder_error):
        return ("item-error", i, text(result))
    try:
        plain = {"tokens": result.tokens, "text": result.text, "decoder": getattr(result, "decoder", ""),
                 "finish_reason": result.finish_reason, "margins": result.margins, "stats": result.stats,
                 "timing": result.timing.as_dict()}
        return ("result", i, json.dumps(plain, default=_jsonable))
    except Exception as e:  # noqa: BLE001 - whatever the result is, it is the decoder's
        return ("garbage", i, f"a result that is not plain data ({type(result).__name__}: {text(e)[:300]})")


def _jsonable(obj):
    """numpy and torch values as plain Python (a numpy scalar in stats is common and harmless);
    anything else is refused (TypeError), and the result is the decoder's garbage."""
    if type(obj).__module__.split(".")[0] in ("numpy", "torch") and callable(getattr(obj, "tolist", None)):
        return obj.tolist()
    raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__} is not plain data")


# ------------------------------------------------------------------------------- the parent side

# What a worker may send: kind -> (its length, the payload's type); the index is an int (None
# allowed for the ends of a call).
MESSAGES = {"ready": (1, None), "done": (1, None), "load-failed": (2, dict), "result": (3, str),
            "item-error": (3, str), "garbage": (3, str), "contract": (3, str), "raised": (3, dict)}
EXC_KEYS = ("exception", "message", "at", "traceback")  # what exc_info gives, and its readers need


def protocol(data: bytes) -> list:
    """A worker's message, checked: anything else (written on the pipe by the decoder, or by a
    patched worker) is the decoder's break of the protocol, never the parent's exception. A
    result's JSON is parsed here, and a timing that is no measurement is the decoder's garbage."""
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError) as e:
        return _broken(f"a message that is not JSON ({text(e)[:200]})")
    if not (isinstance(msg, list) and msg and msg[0] in MESSAGES):
        return _broken(f"a message that is not decodegate's protocol ({data[:80]!r})")
    n, payload = MESSAGES[msg[0]]
    index_ok = n < 3 or isinstance(msg[1], int) and not isinstance(msg[1], bool) or (
        msg[1] is None and msg[0] in ("raised", "contract"))
    if len(msg) != n or not index_ok or (payload is not None and not isinstance(msg[-1], payload)):
        return _broken(f"a {msg[0]!r} message of the wrong shape ({data[:80]!r})")
    if payload is dict and not all(isinstance(msg[-1].get(k), str) for k in EXC_KEYS):
        return _broken(f"a {msg[0]!r} message without {', '.join(EXC_KEYS)} ({data[:80]!r})")
    if msg[0] == "result" and (why := _not_a_result(msg[2])):
        return ["garbage", msg[1], why]
    return msg


def _broken(why: str) -> list:
    return ["contract", None, f"the worker sent {why}"]


def _not_a_result(payload: str) -> str | None:
    """Why a result's JSON is not one (not an object, a timing that measures nothing), or None."""
    import math
    try:
        plain = json.loads(payload)
    except (ValueError, RecursionError) as e:
        return f"a result that is not JSON ({text(e)[:200]})"
    if not isinstance(plain, dict):
        return f"a result that is not a JSON object ({type(plain).__name__})"
    timing = plain.get("timing")
    if not isinstance(timing, dict):
        return None  # named by the runner's checks (a result without a timing)
    wall, ttft = timing.get("wall_s"), timing.get("ttft_s")
    real = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0  # noqa: E731
    if real(wall) and ttft is not None and not (real(ttft) and ttft <= wall):
        return f"a timing that measures nothing (time to first token {ttft!r} s, wall {wall!r} s)"
    return None


PROBE_LIMIT_S = 300.0  # a decoder module's import (it may import torch, a kernel library, ...)


def probe_import(name: str) -> str | None:
    """Import a team's decoder ("module:Class" or an entry point's name) in a forked child first:
    decodegate imports the module itself (the preflight, the option check, the code fingerprint),
    so one that ends the process at import (os._exit, sys.exit, a signal) would end decodegate with
    no verdict, exit 0 included. None when the child imported it, or raised (decodegate's own import
    raises the same, as an input error); else why not, in one line."""
    import select
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the import, then what came of it
        os.close(r)
        said = b"returned"
        try:
            from decoders.base import get_decoder_class
            get_decoder_class(name)
        except Exception:  # noqa: BLE001 - an exception is the parent's import to report
            pass
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: it would end decodegate
            said = type(e).__name__.encode()[:60]
        os.write(w, said)
        os._exit(0)
    os.close(w)
    try:
        ready = select.select([r], [], [], PROBE_LIMIT_S)[0]
        said = os.read(r, 64) if ready else b""
    finally:
        os.close(r)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    if said == b"returned":
        return None
    if said:
        return f"importing its module raised {said.decode(errors='replace')}"
    if not ready:
        return f"importing its module did not finish in {PROBE_LIMIT_S:g} s"
    how = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
           else f"exited with status {os.waitstatus_to_exitcode(status)}")
    return f"importing its module ended the process ({how})"


def _context():
    torch = sys.modules.get("torch")
    cuda_up = torch is not None and torch.cuda.is_initialized()
    return multiprocessing.get_context("spawn" if cuda_up else "fork")


class Worker:
    """The parent's handle on one decoder's worker process."""

    def __init__(self, name: str, build: tuple, memory: float | None = None, protect: tuple = ()):
        """`protect`: folders the decoder may read but not write (the run folder)."""
        self.name = name
        ctx = _context()
        fd, self.stderr_path = tempfile.mkstemp(prefix=f"decodegate-worker-{os.getpid()}-", suffix=".log")
        os.close(fd)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, build, memory, self.stderr_path, tuple(map(str, protect))),
                                name=f"decodegate-worker:{name}", daemon=True)
        self.proc.start()
        child.close()
        _PARENT_ENDS.append(self.conn)
        self.dead: Death | None = None

    def ready(self) -> dict | Death | None:
        """Wait for the load: None when ready, the load failure (exc_info, `input_error`), or a Death."""
        msg = self._next(LOAD_LIMIT_S, "the load limit")
        if isinstance(msg, Death):
            return msg
        if msg[0] in ("ready", "load-failed"):
            return None if msg[0] == "ready" else msg[1]
        why = msg[-1] if isinstance(msg[-1], str) else f"a {msg[0]!r} message before it was ready"
        return {"exception": "ContractError", "message": why, "at": "?", "ours": False, "traceback": why + "\n"}

    def run(self, requests: list, limit: float | None):
        """Yield `(kind, index, payload)` per request ("result" with JSON text, "item-error",
        "garbage"), then at most one end: ("raised", i, exc_info), ("contract", i, why) or
        ("died", i, Death). Each index comes once, checked here; a short stream is a break."""
        if self.dead is not None:
            yield "died", 0, self.dead
            return
        self.conn.send(("generate", requests))
        pending = list(range(len(requests)))
        while pending:
            msg = self._next(limit)
            if isinstance(msg, Death):
                yield "died", pending[0], msg
                return
            kind, i = msg[0], (msg[1] if len(msg) > 1 else None)
            if kind == "done":
                yield "contract", pending[0], f"generate_many ended with no result for {len(pending)} requests"
                return
            if kind in ("raised", "contract"):
                yield kind, i if i in pending else pending[0], msg[2]
                return
            if i not in pending:
                yield "contract", pending[0], f"generate_many yielded index {i} twice"
                return
            pending.remove(i)
            yield kind, i, msg[2]
        end = self._next(limit)  # the call's "done", or a break after its last answer
        if isinstance(end, Death):
            yield "died", len(requests) - 1, end
        elif end[0] in ("raised", "contract"):
            yield end[0], len(requests) - 1 if end[1] is None else end[1], end[2]

    def _next(self, limit: float | None, what: str = "the item limit: --item-timeout, --hang-factor"):
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return self._end(self._hung(limit, what))
            if self.conn.poll(wait):
                try:
                    return protocol(self.conn.recv_bytes(MESSAGE_LIMIT))
                except OSError as e:
                    if "bad message length" not in str(e):
                        return self._end(self._died())
                    # Its body is left unread: the pipe is no longer framed, so the worker goes.
                    self.proc.kill()
                    self.proc.join()
                    return self._end(Death(f"sent a message over {MESSAGE_LIMIT / 2 ** 20:g} MiB (a result too large "
                                           f"to judge)", self.tail()))
                except EOFError:
                    return self._end(self._died())
            if not self.proc.is_alive() and not self.conn.poll(0):
                return self._end(self._died())

    def _end(self, death: Death) -> Death:
        self.dead = death
        return death

    def _died(self) -> Death:
        self.proc.join(5)
        code, tail = self.proc.exitcode, self.tail(lines=200)  # faulthandler's report, whole
        if code is None:
            self.proc.kill()
            self.proc.join()
            how = "closed its pipe without exiting"
        elif code < 0:
            name = signal.Signals(-code).name
            how = f"killed by {name}" + (" (the out-of-memory killer, or from outside)" if name == "SIGKILL" else "")
        else:
            how = f"exited with status {code} (sys.exit or os._exit in the decoder, or an exit in native code)"
        oom = any(w in tail for w in MEMORY_WORDS)
        return Death(("out of memory: " if oom else "") + how, tail, out_of_memory=oom)

    def _hung(self, limit: float, what: str) -> Death:
        """Past the item limit: its stack first (faulthandler answers SIGUSR1 even under a held
        GIL), then SIGKILL."""
        try:  # to the group: the decoder's process is below the one the parent started
            os.killpg(self.proc.pid, signal.SIGUSR1)
            self.proc.join(STACK_WAIT_S)
        except ProcessLookupError:
            pass
        self.proc.kill()
        self.proc.join()
        return Death(f"no result after {limit:.3g} s ({what})",
                     self.tail(lines=200), hung=True)

    def _kill_group(self) -> None:
        """The processes the decoder forked, in the worker's group (a setsid escapes: a cgroup would not)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, TypeError):
            pass

    def tail(self, lines: int = TAIL_LINES) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.stderr_path) - 64_000))
                data = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(data.rstrip().splitlines()[-lines:])

    def close(self) -> None:
        """Stop the worker (a clean stop, else SIGKILL) and remove its output file."""
        if self.proc.is_alive():
            try:
                self.conn.send(("stop",))
            except (OSError, ValueError):
                pass
            self.proc.join(2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        self._kill_group()
        self.conn.close()
        if self.conn in _PARENT_ENDS:
            _PARENT_ENDS.remove(self.conn)
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass
