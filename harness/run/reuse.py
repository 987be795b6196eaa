"""The baseline store as a run uses it: content keys for the lineup's baseline, reused rows,
rows written back, and the freshly timed subset that speed comparisons rest on."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from harness.run import fingerprint as fpr
from harness.run.store import BaselineStore

RUN_COPY = "baseline_store"  # the run folder's own copy of its baseline rows (uploaded to MLflow)
RESULT_FIELDS = ("tokens", "text", "finish_reason", "margins", "stats", "timing")


def spec_fingerprints(lineup, spec) -> dict:
    """`target_fingerprint` (and `draft_fingerprint`) of one decoder of the lineup, for its rows."""
    from harness.build import get_model, is_model_draft
    import hashlib
    import json
    dec = lineup.decoders[spec.name]
    server = getattr(dec, "server", None)
    if server is not None and hasattr(server, "info"):
        eng = fpr.engine_fingerprint(server)
        out = {"target_fingerprint": "engine:" + hashlib.sha256(json.dumps(eng, sort_keys=True).encode()
                                                                ).hexdigest()[:16]}
    else:
        out = {"target_fingerprint": fpr.model_fingerprint(lineup.targets[spec.name])}
    draft = spec.options.get("draft")
    if isinstance(draft, str) and is_model_draft(draft):
        target = lineup.targets[spec.name]
        loaded = target if draft == target.name else get_model(draft, spec.options.get("draft_device")
                                                               or str(target.device))
        out["draft_fingerprint"] = fpr.model_fingerprint(loaded)
    return out


class Reuse:
    """Looks baseline rows up by content key, writes fresh ones back, counts both."""

    def __init__(self, store: BaselineStore | None, lineup, run_dir: Path, run_uid: str):
        self.store = store
        self.lineup = lineup
        self.copy = BaselineStore(Path(run_dir) / RUN_COPY)
        self.source = {"run_uid": run_uid, "run_dir": str(run_dir)}
        self._base: dict[str, dict] = {}
        self.reused = 0
        self.stored = 0
        self.retimed = 0
        self.disagreed: list[str] = []   # re-timed rows whose output differs from the stored one

    def _spec_parts(self, spec) -> dict:
        if spec.name not in self._base:
            dec, target = self.lineup.decoders[spec.name], self.lineup.targets[spec.name]
            options = {k: v for k, v in spec.options.items() if k not in ("engine", "aa_engine")}
            parts = {"format": fpr.FORMAT, "decoder": spec.decoder, "options": options,
                     **spec_fingerprints(self.lineup, spec)}
            server = getattr(dec, "server", None)
            if server is not None and hasattr(server, "info"):
                parts["engine"] = fpr.engine_fingerprint(server)
                parts["tokenizer"] = fpr.tokenizer_fingerprint(target.tokenizer)
            else:
                parts.update(code=fpr.code_fingerprint(dec), dtype=str(target.dtype), **fpr.environment(target.device))
            self._base[spec.name] = parts
        return self._base[spec.name]

    def key(self, spec, request) -> tuple[str, dict]:
        from harness.run.store import key_of
        req = dataclasses.asdict(request)
        parts = {**self._spec_parts(spec), "request": req}
        return key_of(parts), parts

    def lookup(self, key: str) -> dict | None:
        return self.store.get(key) if self.store is not None else None

    def put(self, key: str, parts: dict, row: dict, reused_from: dict | None = None) -> None:
        """Keep a baseline row: in the run's own copy always, in the store when it was generated."""
        if row.get("error") or not row.get("tokens"):
            return  # a failed generation is retried next time, never reused
        result = {k: row.get(k) for k in RESULT_FIELDS}
        source = reused_from or self.source
        self.copy.put(key, parts, result, source)
        if reused_from is None and self.store is not None and self.store.put(key, parts, result, source):
            self.stored += 1

    def compare(self, stored: dict | None, row: dict, label: str) -> None:
        """A re-timed baseline row against the stored one: they must agree (same key, same output)."""
        if stored is None:
            return
        self.retimed += 1
        if not row.get("error") and stored["result"].get("tokens") != row.get("tokens"):
            self.disagreed.append(label)

    def summary(self) -> dict:
        return {"store": self.store.label if self.store is not None else None, "reused": self.reused,
                "stored": self.stored, "retimed": self.retimed, "retimed_disagreed": self.disagreed,
                "skipped": list(self.store.skipped) if self.store is not None else []}


def stored_result(row: dict) -> SimpleNamespace:
    """A stored row's result in the shape `runner.make_row` takes."""
    r = row["result"]
    timing = dict(r.get("timing") or {})
    return SimpleNamespace(tokens=r.get("tokens") or [], text=r.get("text") or "", finish_reason=r.get("finish_reason"),
                           margins=r.get("margins") or [], stats=r.get("stats") or {},
                           timing=SimpleNamespace(as_dict=lambda: timing))
