"""What is generating now, kept in the run folder so that a run that dies is named by the next.

Decoders that run code in process generate in workers (harness.run.worker): their deaths and
hangs are seen by the parent at once and become stop rows in the same run. What is left here is
the parent's own side: before each item the runner writes `inflight.json` (atomically) naming
the decoder and the item, and removes it when the item is done. A parent killed from outside
(SIGKILL, a CI timeout) leaves the note and no crash report: the next run says so, blames no
decoder and resumes. An engine decoder (an HTTP client, in process) is still bounded by the
watchdog thread here, which ends the run when one of its items runs past its limit
(harness.run.faults.item_limit), and faulthandler writes a native crash's signal to `fatal.log`,
so that `previous_death` names it.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path

from harness.run.faults import FATAL, GRACE_S, HUNG_EXIT, TRACEBACKS, item_label

INFLIGHT = "inflight.json"
# faulthandler's first line for each fatal signal it handles.
SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
           "Illegal instruction": "SIGILL", "Floating-point exception": "SIGFPE",
           "Floating point exception": "SIGFPE"}


def _atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class InFlight:
    """The in-flight note, the crash log and the watchdog, for one run on a folder."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / INFLIGHT
        self._fatal = open(self.run_dir / FATAL, "w")  # this run's crash report only
        self._was_enabled = faulthandler.is_enabled()
        faulthandler.enable(file=self._fatal, all_threads=True)

    @contextmanager
    def item(self, name: str, works: list, limit: float | None, fingerprint: dict):
        """While `name` generates `works` (one item, or an engine's block): the note, and a
        watchdog when a limit in seconds is known."""
        note = {"candidate": name, "item": item_label(works[0]), "items": [item_label(w) for w in works],
                "pid": os.getpid(), "limit_s": limit, "fingerprint": fingerprint}
        _atomic(self.path, note)
        timer = None
        if limit is not None:
            timer = threading.Timer(limit, self._hung, (note, threading.get_ident()))
            timer.daemon = True
            timer.start()
            faulthandler.dump_traceback_later(limit + GRACE_S, exit=True, file=self._fatal)
        try:
            yield
        finally:  # a hang never gets here (the watchdog ends the process), so its note stays
            if timer is not None:
                timer.cancel()
                faulthandler.cancel_dump_traceback_later()
            self.path.unlink(missing_ok=True)

    def _hung(self, note: dict, ident: int) -> None:
        """The watchdog fired: write the line and the generating thread's stack, keep the note for
        the next run, and end the process (every row is already on disk)."""
        frame = sys._current_frames().get(ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no Python stack)\n"
        line = (f"{note['candidate']}: hung on {note['item']}: no result after {note['limit_s']:.3g} s "
                f"(the item limit: --item-timeout, --hang-factor)")
        folder = self.run_dir / TRACEBACKS
        folder.mkdir(exist_ok=True)
        (folder / f"{note['candidate']}.txt").write_text(f"{line}\n\nPython stack of the generating thread:\n{stack}")
        _atomic(self.path, {**note, "hung": line})
        print(f"decodegate: {line}; the run ends here and every finished row is kept in {self.run_dir}\n"
              f"Python stack of the generating thread:\n{stack}"
              f"decodegate: the next regress on this folder goes on without {note['candidate']}",
              file=sys.stderr, flush=True)
        os._exit(HUNG_EXIT)

    def close(self) -> None:
        faulthandler.disable()
        self._fatal.close()
        fatal = self.run_dir / FATAL
        if fatal.exists() and fatal.stat().st_size == 0:  # nothing crashed: no empty file left behind
            fatal.unlink()
        if self._was_enabled:  # as it was before this run (pytest's own handler, say)
            faulthandler.enable(file=sys.__stderr__, all_threads=True)


def in_flight(run_dir: Path) -> str | None:
    """The decoder a previous run on this folder was generating when it crashed or hung, or None
    (none in flight, or the run was killed from outside)."""
    try:
        note = json.loads((Path(run_dir) / INFLIGHT).read_text())
        name = note["candidate"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fatal = Path(run_dir) / FATAL
    crashed = fatal.exists() and _signal(fatal.read_text(errors="replace")) is not None
    return name if note.get("hung") or crashed else None


def previous_death(run_dir: Path) -> dict | None:
    """The stop row for the decoder a previous run on this folder died in (a native crash, or the
    watchdog), or None; the note is consumed and the crash report kept beside the traceback. A run
    killed from outside (no crash report) blames no one: its row has reason "killed"."""
    path = Path(run_dir) / INFLIGHT
    try:
        note = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    fatal = Path(run_dir) / FATAL
    report = fatal.read_text(errors="replace") if fatal.exists() else ""
    name = note.get("candidate", "?")
    signal = _signal(report)
    if note.get("hung"):
        reason, line = "hung", f"the previous run ended when {note['hung']}"
    elif signal is None:  # killed from outside (SIGKILL, a CI timeout): not the decoder's doing
        path.unlink()
        return {"candidate": name, "reason": "killed",
                "detail": f"the previous run was killed while {name} was generating {note.get('item', '?')}; "
                          f"resuming"}
    else:
        reason = "crashed"
        line = f"the previous run died ({signal}) while {name} was generating {note.get('item', '?')}"
    folder = Path(run_dir) / TRACEBACKS
    folder.mkdir(exist_ok=True)
    trace = folder / f"{name}.txt"
    if reason == "crashed" or not trace.exists():
        trace.write_text(f"{line}\n\n{report or '(no crash report: the process was killed)'}")
    path.unlink()
    return {"candidate": name, "suite": "*", "reason": reason, "detail": line, "item": note.get("item"),
            "traceback": f"{TRACEBACKS}/{name}.txt", "fingerprint": note.get("fingerprint")}


def _signal(report: str) -> str | None:
    """The fatal signal faulthandler named in its report ("Fatal Python error: Segmentation fault");
    None where it wrote none (the process was killed from outside)."""
    for line in reversed(report.splitlines()):
        if line.startswith("Fatal Python error:"):
            text = line.split(":", 1)[1].strip()
            return next((sig for words, sig in SIGNALS.items() if text.startswith(words)), text)
        if line.startswith("Timeout ("):
            return "hung past the watchdog, ended by faulthandler"
    return None
