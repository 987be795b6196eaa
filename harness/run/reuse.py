"""The baseline store as a run uses it: content keys for the lineup's baseline, reused rows,
rows written back, and the re-check that makes reuse fail closed.

Reuse is refused, and the rows are generated, where a key cannot vouch for the output:
- an engine given only by `base_url`: nothing identifies the deployment behind the URL (a
  redeploy under the same alias looks the same), unless its [engines.NAME] says
  `reuse_baseline = true`;
- a run whose re-timed rows (the speed sample, harness.run.speed_sample) differ from their
  stored rows beyond a near-tie: the store does not reproduce under its own key, so none of its
  rows is taken in that run (the runner times the sample before it takes any stored row).
"""
from __future__ import annotations

import dataclasses
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

from harness.run import fingerprint as fpr
from harness.run.store import BaselineStore

RUN_COPY = "baseline_store"  # the run folder's own copy of its baseline rows (uploaded to MLflow)
RESULT_FIELDS = ("tokens", "text", "finish_reason", "margins", "stats", "timing")


def spec_fingerprints(lineup, spec) -> dict:
    """`target_fingerprint` (and `draft_fingerprint`) of one decoder of the lineup, and
    `code_fingerprint`, the source it runs: for its rows, and for a resumed run folder, which must
    not mix rows of other models or other code."""
    from harness.build import get_model, is_model_draft
    import hashlib
    import json
    dec = lineup.decoders.get(spec.name)  # built here only for an engine; the others run in workers
    server = getattr(dec, "server", None)
    if server is not None and hasattr(server, "info"):
        eng = fpr.engine_fingerprint(server)
        out = {"target_fingerprint": "engine:" + hashlib.sha256(json.dumps(eng, sort_keys=True).encode()
                                                                ).hexdigest()[:16],
               "code_fingerprint": fpr.engine_client_fingerprint(type(dec))}
    else:
        out = {"target_fingerprint": fpr.model_fingerprint(lineup.targets[spec.name]),
               "code_fingerprint": fpr.code_fingerprint(lineup.decoder_type(spec.name))}
    draft = spec.options.get("draft")
    if isinstance(draft, str) and is_model_draft(draft):
        target = lineup.targets[spec.name]
        loaded = target if draft == target.name else get_model(draft, spec.options.get("draft_device")
                                                               or str(target.device))
        out["draft_fingerprint"] = fpr.model_fingerprint(loaded)
    return out


def retime_difference(stored: dict, fresh: dict, eps: float) -> str | None:
    """How a freshly generated baseline row differs from its stored row, or None where they agree
    (a first divergence at a numerical near-tie of the stored row's margin counts as agreeing)."""
    from analysis.identity import classify_margin, common_prefix_length
    a, b = list(stored.get("tokens") or []), list(fresh.get("tokens") or [])
    if a == b:
        return None
    pos = common_prefix_length(a, b)
    margins = stored.get("margins") or []
    margin = margins[pos] if pos < len(margins) else None
    if pos < min(len(a), len(b)) and classify_margin(margin, eps) == "near-tie":
        return None
    return (f"differs at token {pos} (stored margin {margin if margin is not None else 'n/a'}, "
            f"near-tie epsilon {eps:g})")


def _eps(lineup, spec) -> float:
    from analysis.identity import near_tie_epsilon
    eps = lineup.config.gates.near_tie_epsilon
    if eps is None:
        eps = near_tie_epsilon(str(lineup.targets[spec.name].dtype).replace("torch.", ""), None)[0]
    return float(eps)


class Reuse:
    """Looks baseline rows up by content key, writes fresh ones back, checks re-timed rows against
    the store, counts all three."""

    def __init__(self, store: BaselineStore | None, lineup, run_dir: Path, run_uid: str):
        self.store = store
        self.lineup = lineup
        self.copy = BaselineStore(Path(run_dir) / RUN_COPY)
        self.source = {"run_uid": run_uid, "run_dir": str(run_dir)}
        # The speed sample is drawn with this seed: the same on resume, other items in another run.
        self.seed = zlib.crc32(run_uid.encode())
        self._base: dict[str, dict] = {}
        self.refused: dict[str, str] = {}  # baseline spec -> why its rows are never taken from the store
        self.reused = 0
        self.stored = 0
        self.retimed = 0
        self.near_ties = 0
        self.disagreed: list[str] = []   # re-timed rows whose output differs from the stored one

    @property
    def valid(self) -> bool:
        """False once a re-timed row differed: no stored row is taken for the rest of the run."""
        return not self.disagreed

    def _spec_parts(self, spec) -> dict:
        if spec.name not in self._base:
            dec, target = self.lineup.decoders.get(spec.name), self.lineup.targets[spec.name]
            options = {k: v for k, v in spec.options.items() if k not in ("engine", "aa_engine")}
            parts = {"format": fpr.FORMAT, "decoder": spec.decoder, "options": options,
                     **spec_fingerprints(self.lineup, spec)}
            server = getattr(dec, "server", None)
            if server is not None and hasattr(server, "info"):
                parts["engine"] = fpr.engine_fingerprint(server)
                parts["code"] = fpr.engine_client_fingerprint(type(dec))
                parts["tokenizer"] = fpr.tokenizer_fingerprint(target.tokenizer)
                if not server.spec.launch:
                    if getattr(server.spec, "reuse_baseline", False):
                        parts["deployment"] = "declared pinned: reuse_baseline = true"
                    else:
                        self.refused[spec.name] = (
                            f"{spec.name}: engine {server.spec.name!r} is given by base_url, and nothing identifies "
                            f"the deployment behind it, so its rows are generated, not reused (set "
                            f"reuse_baseline = true in [engines.{server.spec.name}] where that deployment is pinned)")
            else:
                parts.update(code=fpr.code_fingerprint(self.lineup.decoder_type(spec.name)), dtype=str(target.dtype), **fpr.environment(target.device))
            self._base[spec.name] = parts
        return self._base[spec.name]

    def key(self, spec, request) -> tuple[str, dict]:
        from harness.run.store import key_of
        req = dataclasses.asdict(request)
        parts = {**self._spec_parts(spec), "request": req}
        return key_of(parts), parts

    def lookup(self, spec, key: str) -> dict | None:
        """The stored row under `key`, where `spec`'s rows may come from the store at all."""
        if self.store is None or spec.name in self.refused:
            return None
        return self.store.get(key)

    def put(self, spec, key: str, parts: dict, row: dict, reused_from: dict | None = None) -> None:
        """Keep a baseline row: in the run's own copy always, in the store when it was generated
        (and its key identifies it: not for an engine whose rows are refused)."""
        if row.get("error") or not row.get("tokens"):
            return  # a failed generation is retried next time, never reused
        result = {k: row.get(k) for k in RESULT_FIELDS}
        source = reused_from or self.source
        self.copy.put(key, parts, result, source)
        if (reused_from is None and self.store is not None and spec.name not in self.refused
                and self.store.put(key, parts, result, source)):
            self.stored += 1

    def compare(self, spec, stored: dict | None, row: dict, label: str) -> None:
        """A re-timed baseline row against the stored one: the same key must give the same output
        (up to a near-tie). One that differs switches reuse off for the run."""
        if stored is None or row.get("error"):
            return
        self.retimed += 1
        why = retime_difference(stored["result"], row, _eps(self.lineup, spec))
        if why is None:
            self.near_ties += stored["result"].get("tokens") != row.get("tokens")
            return
        first = self.valid
        self.disagreed.append(f"{label}: {why}")
        if first:
            print(f"decodegate: warning: baseline store: re-timed row {label} {why}: {self.refusal()}",
                  file=sys.stderr)

    def refusal(self) -> str | None:
        """Why rows were not reused, in words; None where nothing was refused."""
        why = list(self.refused.values())
        if self.disagreed:
            why.insert(0, f"{len(self.disagreed)} re-timed baseline row(s) differ from the stored ones beyond a "
                          f"near-tie ({', '.join(d.split(':')[0] for d in self.disagreed[:5])}"
                          f"{', ...' if len(self.disagreed) > 5 else ''}): the store does not reproduce under "
                          f"its keys, so no stored row is reused in this run; every baseline row is generated")
        return "; ".join(why) or None

    def summary(self) -> dict:
        return {"store": self.store.label if self.store is not None else None, "reused": self.reused,
                "stored": self.stored, "retimed": self.retimed, "retimed_disagreed": self.disagreed,
                "retimed_near_ties": self.near_ties, "reuse_refused": self.refusal(), "speed_seed": self.seed,
                "skipped": list(self.store.skipped) if self.store is not None else []}


def stored_result(row: dict) -> SimpleNamespace:
    """A stored row's result in the shape `runner.make_row` takes."""
    r = row["result"]
    timing = dict(r.get("timing") or {})
    return SimpleNamespace(tokens=r.get("tokens") or [], text=r.get("text") or "", finish_reason=r.get("finish_reason"),
                           margins=r.get("margins") or [], stats=r.get("stats") or {},
                           timing=SimpleNamespace(as_dict=lambda: timing))
