"""Run the baseline and every candidate on each suite item, temperature and seed.

Each result is appended to `records.jsonl` in the run folder the moment it exists (flushed and
fsynced), so a killed run loses at most the generation in flight. A rerun on the same folder
reads what is there and skips it (resume); the analysis then sees the same rows.

Decoders run interleaved per work item (baseline, cand-1, cand-2, baseline, ...) so that machine
noise and thermal drift hit all of them alike: latency comparisons stay paired.

`run` reads as its stages: plan the work (harness.run.work, plan.json), read what the folder holds
(Ledger), the baseline's store side (harness.run.store_take), then block by block the baseline and
each candidate generating (with --fail-fast's check on exact candidates), the looks after each
stage, and the records. Generation happens in each decoder's worker process (harness.run.worker,
started by Lineup); this process validates what comes back, writes every row and stop, and judges
nothing: judging is harness.commands.regress.finish, over the records alone.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from decoders.base import DecoderError
from decoders.engines.server import EngineDown
from harness.build import build_decoder, get_model
from harness.config import DecoderSpec, RegressConfig
from harness.run.faults import (BROKEN, GRACE_S, BaselineBroken, Policy, garbage, item_limit, raised, results,
                                vocabulary)
from harness.run.inflight import INFLIGHT, InFlight, in_flight, previous_death
from harness.run.remote import Broke, RemoteDecoder, answer
from harness.run.records import LMEVAL_DONE, PLAN, RECORDS, RecordWriter, read_records, record_key  # noqa: F401 - re-exported
from harness.run.store_take import StoreTake
from harness.run.work import (WorkItem, expand, make_request, make_row, runs_on,  # noqa: F401 - re-exported
                              staged_work, work_items)


def load_suites(config: RegressConfig) -> list:
    from suites import load_suite
    out = []
    for name in config.profile.suites:
        if name.startswith("lmeval:"):
            continue  # run through lm-eval: see run_lmeval
        suite = load_suite(config.suites[name].path or name)
        if suite.name != name:
            from harness.config import ConfigError
            raise ConfigError(f"suite file {config.suites[name].path} declares suite {suite.name!r}, "
                              f"but the config calls it {name!r}")
        out.append(suite)
    return out


class Lineup:
    """The baseline and candidates with their targets. Each decoder that runs code in process
    generates in a worker process of its own (harness.run.worker), forked first, before this
    process loads any model, with the folders in `protect` (the run folder) read-only to it;
    engine decoders (`engines`: started servers by name,
    harness.run.engines.started) are built here. `decoders[name]` gives, on first use, what the
    stages after generation ask (exactness windows, load, lm-eval): the decoder in its worker,
    which stays up until `close`, or an engine decoder."""

    def __init__(self, config: RegressConfig, engines: dict | None = None, worker_memory: float | None = None,
                 protect: tuple = ()):
        from harness.run.sweep import all_specs, is_engine
        self.config = config
        self.policy = Policy()  # the runner's (its item limit bounds a request after generation too)
        # The baseline and candidates, at each concurrency level, plus the A/A run of an engine
        # baseline (harness.run.sweep); without a sweep and an engine: [baseline, *candidates].
        self.specs: list[DecoderSpec] = all_specs(config)
        from harness.run.worker import Worker
        preload_for(config, [s for s in self.specs if not is_engine(s)])
        self.workers = {s.name: Worker(s.name, (s.target or config.target, config.device, s.decoder, dict(s.options)),
                                       worker_memory, protect) for s in self.specs if not is_engine(s)}
        try:
            self._build(config, engines)
            self.load_failures = self._loaded()
        except BaseException:
            self.close()
            raise
        # The plain baseline at each concurrency level (not its A/A rerun): what the store may supply.
        b = config.baseline.name
        self.baseline_names = {s.name for s in self.specs if s.role != "aa-floor"
                               and (s.name == b or s.name.startswith(b + "@c"))}
        from harness.run.reuse import spec_fingerprints
        self.fingerprints = {s.name: spec_fingerprints(self, s) for s in self.specs}

    def _build(self, config: RegressConfig, engines: dict | None) -> None:
        """The targets, and the engine decoders; the others are built in their workers (and here on first use)."""
        from decoders.engines.server import EngineError
        from harness.config import ConfigError
        from harness.models import ModelError
        self.targets = {}
        self.decoders = _OnFirstUse(self, engines)
        for spec in self.specs:
            try:
                self.targets[spec.name] = get_model(spec.target or config.target, config.device)
                if spec.name not in self.workers:
                    self.decoders[spec.name] = build_decoder(spec.decoder, self.targets[spec.name], spec.options, engines)
            except (DecoderError, ModelError) as e:
                if isinstance(e, EngineError):  # an engine's own failure, named by the engine
                    raise
                raise ConfigError(f"{self.config.path}: {spec.name!r} (decoder {spec.decoder!r}): {e}") from e

    def _loaded(self) -> dict:
        """Each worker's load: a bad option is the config's (ConfigError, as in process); any other
        failure (an exception, an exit, a death) is that decoder's, kept to become its stop row."""
        from harness.config import ConfigError
        failures = {}
        for name, worker in self.workers.items():
            failure = worker.ready()
            if isinstance(failure, dict) and failure.get("input_error"):
                spec = next(s for s in self.specs if s.name == name)
                raise ConfigError(f"{self.config.path}: {name!r} (decoder {spec.decoder!r}): {failure['message']}")
            if failure is not None:
                failures[name] = failure
        return failures

    def decoder_type(self, name: str) -> type:
        """The class a decoder runs, without building one (its code fingerprint)."""
        if name in self.decoders and name not in self.workers:
            return type(self.decoders[name])
        from decoders import get_decoder_class
        return get_decoder_class(next(s for s in self.specs if s.name == name).decoder)

    def close(self) -> None:
        """Stop the workers (generation is over, or the run stops)."""
        for worker in getattr(self, "workers", {}).values():
            worker.close()

    @property
    def baseline_target(self):
        return self.targets[self.specs[0].name]  # the baseline (at the first concurrency level)

    def block_size(self) -> int:
        """Work items per interleaving block: the most requests any decoder keeps in flight."""
        return max([int(getattr(d, "concurrency", 1)) for d in dict.values(self.decoders)] + [1])


def preload_for(config: RegressConfig, specs: list) -> None:
    """The modules every worker would import for itself, imported once here before they are
    forked: their targets' and drafts' model code, and the built-in decoders (a team's decoder
    module is its own worker's to import)."""
    from decoders.base import get_decoder_class, is_builtin
    from harness.models import preload
    for model in {m for s in specs for m in (s.target or config.target, s.options.get("draft")) if isinstance(m, str)}:
        preload(model)
    for s in specs:
        if is_builtin(s.decoder):
            get_decoder_class(s.decoder)


class _OnFirstUse(dict):
    """Decoders by name for the stages after generation, made when one first asks: the decoder in
    its worker (harness.run.remote.RemoteDecoder), or an engine decoder built here."""

    def __init__(self, lineup: Lineup, engines: dict | None):
        super().__init__()
        self.lineup, self.engines = lineup, engines

    def __missing__(self, name: str):
        lineup = self.lineup
        if name in lineup.workers:  # its code runs in its worker, never here
            self[name] = RemoteDecoder(lineup.workers[name], vocabulary(lineup.targets[name]),
                                       item_limit(lineup.policy, None))
            return self[name]
        spec = next(s for s in lineup.specs if s.name == name)
        self[name] = build_decoder(spec.decoder, lineup.targets[name], spec.options, self.engines)
        return self[name]


STOPS = "stops.jsonl"
ENGINE_BATCHES = "engine_batches.jsonl"


class Stops:
    """Where the runner stopped a candidate (a suite, or "*": all of them), kept in stops.jsonl
    so that a resumed run and the summary know it."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.rows = read_records(run_dir, STOPS)
        self.writer = RecordWriter(run_dir, STOPS)

    def forget(self, drop) -> None:
        """Remove the stops `drop` selects (a broken candidate run again), from the file too."""
        self.writer.close()
        self.rows = [r for r in self.rows if not drop(r)]
        _rewrite(self.run_dir / STOPS, self.rows)
        self.writer = RecordWriter(self.run_dir, STOPS)

    def stopped(self, candidate: str, suite: str) -> bool:
        return any(r["candidate"] == candidate and r["suite"] in ("*", suite) for r in self.rows)

    def add(self, **row) -> None:
        self.rows.append(row)
        self.writer.write(row)

    def close(self) -> None:
        self.writer.close()


def _real_divergence(config: RegressConfig, target, base: dict, cand: dict) -> str | None:
    """--fail-fast: the first divergence of an exact candidate that is not a numerical near-tie."""
    from analysis.identity import classify_margin, common_prefix_length, near_tie_epsilon
    if base.get("error") or cand.get("error") or cand.get("compare_on") == "text":
        return None
    bt, ct = base.get("tokens") or [], cand.get("tokens") or []
    pos = common_prefix_length(bt, ct)
    if pos == len(bt) == len(ct):
        return None
    eps = config.gates.near_tie_epsilon
    if eps is None:
        eps = near_tie_epsilon(str(target.dtype).replace("torch.", ""), None)[0]
    margins = base.get("margins") or []
    margin = margins[pos] if pos < len(margins) else None
    if classify_margin(margin, eps) == "near-tie":
        return None
    return (f"first real divergence: {cand['suite']}/{cand['item_id']} T={cand['temperature']:g} at token {pos}, "
            f"baseline margin {margin if margin is not None else 'n/a'} (near-tie epsilon {eps:g})")


def _checks_identity(spec: DecoderSpec, row: dict) -> bool:
    """Rows on which an exact candidate must match the baseline token for token: greedy ones, and
    sampled ones where it samples with the baseline's keyed noise (coupled verification)."""
    from harness.config import sampled_identity_applies
    if spec.kind != "exact" or spec.role == "aa-floor":
        return False
    return row["temperature"] == 0 or sampled_identity_applies(spec.decoder, spec.options)



class Ledger:
    """The run folder as this run reads and extends it: the generations already there (a
    resumed run skips them), the baseline's rows by pair (--fail-fast compares with them), the
    stops, and the writers. Every row goes through `write`."""

    def __init__(self, run_dir: Path, lineup: Lineup, stages: list):
        self.run_dir = Path(run_dir)
        self.rows = read_records(run_dir)
        self.base_names = lineup.baseline_names
        self.cands = [s for s in lineup.specs if s.name not in self.base_names]
        self.done = {record_key(r) for r in self.rows}
        self.base_rows = {record_key(r)[1:]: r for r in self.rows if r["candidate"] in self.base_names}
        self.stops = Stops(run_dir)
        self.writer = RecordWriter(run_dir)
        self.batches = RecordWriter(run_dir, ENGINE_BATCHES)
        # Generations each decoder has in this run's plan ("2 of 10 items ran").
        self.planned = {s.name: sum(runs_on(s, w.suite.name) for st in stages for w in st) for s in lineup.specs}

    def ran(self, name: str) -> int:
        return sum(1 for k in self.done if k[0] == name)

    def baseline_wall(self, w: WorkItem) -> float | None:
        """The baseline's wall time on this work item, where it has one (a hang is judged by it)."""
        row = self.base_rows.get(w.key("")[1:])
        wall = (row or {}).get("timing", {}).get("wall_s")
        return wall if isinstance(wall, (int, float)) and wall > 0 else None

    def slowest_baseline_wall(self) -> float | None:
        """The baseline's slowest wall time so far: what its own next item is judged by."""
        walls = [(r.get("timing") or {}).get("wall_s") for r in self.base_rows.values()]
        walls = [x for x in walls if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]
        return max(walls) if walls else None

    def wanted(self, spec: DecoderSpec, w: WorkItem) -> bool:
        if w.key(spec.name) in self.done or not runs_on(spec, w.suite.name):
            return False
        if spec.name in self.base_names:  # the baseline, wherever a candidate ran or will run
            return any(runs_on(c, w.suite.name) and (w.key(c.name) in self.done
                                                     or not self.stops.stopped(c.name, w.suite.name))
                       for c in self.cands) or not self.cands
        return not self.stops.stopped(spec.name, w.suite.name)

    def write(self, spec: DecoderSpec, w: WorkItem, row: dict) -> None:
        self.writer.write(row)
        self.done.add(w.key(spec.name))
        if spec.name in self.base_names:
            self.base_rows[record_key(row)[1:]] = row

    def close(self) -> None:
        self.writer.close()
        self.batches.close()
        self.stops.close()


def run(config: RegressConfig, run_dir: Path, lineup: Lineup, suites: list, progress: bool = True,
        reuse=None, fail_fast: bool = False, looks=None, policy: Policy | None = None) -> list[dict]:
    """Generate everything not yet in the run folder; return all rows. The workers stay up for the
    stages after generation (the caller closes the lineup); an error or interrupt closes them here.

    Work goes in stages (one, or one per sequential look) and within a stage in blocks of
    `lineup.block_size()` items (1 for in-process decoders): within a block the baseline runs
    its requests, then each candidate in an order shuffled per block (`block_order`; an engine
    keeps a block's requests in flight at once), so machine noise and order effects hit all
    decoders alike. Every record is written as it finishes.

    `reuse` (harness.run.reuse.Reuse): baseline rows found in the store are taken, not generated,
    except the speed sample, generated afresh beside the candidates and checked against the store
    (harness.run.store_take). Within a stage the items are ordered so that the baseline's store
    misses fill whole blocks: an engine baseline then runs at the concurrency its candidates run at.

    `looks` (the regress command passes harness.verdict.looks.LookPlan): the stages, and after
    each the question "stop now?" (`looks.decisions(records, stops)`: stop rows of candidates whose
    quality is decided on a suite). None: the fixed design, one stage. With `fail_fast` an exact
    candidate stops at its first real divergence.

    `policy` (harness.run.faults.Policy): what happens when a decoder breaks. A candidate that
    raises stops there (a stop row, its verdict a failure), a result that is garbage is a failed
    item, a decoder that crashed or hung in an earlier run on the folder is left out.
    """
    policy = lineup.policy = policy or Policy()
    stages = staged_work(config, suites, looks)                                  # plan
    ledger = Ledger(run_dir, lineup, stages)                                     # what the folder holds
    inflight = None
    try:
        write_plan(run_dir, config, lineup, stages)
        carry_over(run_dir, lineup, ledger.stops, policy)                        # who broke before
        load_stops(lineup, ledger)                                               # who failed to load
        take = StoreTake(config, run_dir, lineup, reuse, stages[0], ledger.rows)  # the baseline's store side
        inflight = InFlight(run_dir)
        ctx = Context(config, lineup, ledger, take, progress_bar(stages, lineup, ledger, progress),
                      inflight, policy, fail_fast)
        for stage in stages:
            pending = take.order(pending_work(stage, lineup, ledger, ctx.bar))
            for block in blocks(pending, lineup.block_size()):
                for spec in block_order(lineup.specs, lineup.baseline_names, ctx.block_no):
                    run_decoder(ctx, spec, block)
                ctx.block_no += 1
            look(looks, run_dir, ledger.stops)                                   # stop now?
        ctx.bar.close()
    except BaseException:
        lineup.close()  # the workers' end; after a finished generation the caller's (its stages use them)
        raise
    finally:
        ledger.close()
        if inflight is not None:
            inflight.close()
    return read_records(run_dir)                                                 # the records


def write_plan(run_dir: Path, config: RegressConfig, lineup: Lineup, stages: list) -> None:
    """Every (decoder, suite, item, seed, temperature) this run's design asks for, and every
    (decoder, lm-eval task, seed, temperature) run (its items are lm-eval's to choose): what the
    exit code checks the folder against (harness.verdict.exit_code)."""
    keys = [list(w.key(s.name)) for st in stages for w in st for s in lineup.specs if runs_on(s, w.suite.name)]
    units = [[spec.name, suite, seed, t] for suite, seed, t, spec in lmeval_units(config, lineup)]
    tmp = Path(run_dir) / (PLAN + ".tmp")
    tmp.write_text(json.dumps({"rows": keys, "lmeval": units, "baselines": sorted(lineup.baseline_names)}))
    os.replace(tmp, Path(run_dir) / PLAN)


def load_stops(lineup: Lineup, ledger: Ledger) -> None:
    """A decoder whose worker failed to load: a candidate's stop row (its verdict FAIL, the others
    go on); the baseline's stops the run (nothing to compare against)."""
    from harness.run.faults import crashed, load_failed
    for name, failure in lineup.load_failures.items():
        fp = lineup.fingerprints[name]
        stop = (load_failed(name, failure, ledger.run_dir, fp) if isinstance(failure, dict)
                else crashed(name, None, failure, ledger.run_dir, 0, ledger.planned[name], fp))
        if name in ledger.base_names:
            ledger.stops.add(**stop)
            raise BaselineBroken(f"{stop['detail']}; the baseline did not load, so no candidate can be judged "
                                 f"(traceback in {ledger.run_dir / stop['traceback']})")
        if ledger.stops.stopped(name, "*"):
            continue  # left out already (it broke in an earlier run)
        print(f"decodegate: {stop['detail']}", file=sys.stderr)
        ledger.stops.add(**stop)


@dataclass
class Context:
    """What every decoder's turn in a block uses."""
    config: RegressConfig
    lineup: Lineup
    ledger: Ledger
    take: StoreTake
    bar: object
    inflight: InFlight
    policy: Policy
    fail_fast: bool
    block_no: int = 0


def carry_over(run_dir: Path, lineup: Lineup, stops: Stops, policy: Policy) -> None:
    """A decoder that broke in an earlier run on this folder (raised, crashed or hung) is named and
    left out, unless it changed since (its fingerprint) or `policy.retry`: then it runs again. A
    baseline that crashed or hung stops the run: nothing is left to compare against."""
    death = previous_death(run_dir)
    if death is not None:
        print(f"decodegate: {death['detail']}", file=sys.stderr)
        if death["reason"] in BROKEN:
            stops.add(**death)
    changed = lambda r: r.get("fingerprint") not in (None, lineup.fingerprints.get(r["candidate"]))  # noqa: E731
    again = [r for r in stops.rows if r.get("reason") in BROKEN and (policy.retry or changed(r))]
    if again:
        stops.forget(lambda r: r in again)
        why = "--retry-broken" if policy.retry else "changed since it broke"
        print(f"decodegate: {', '.join(sorted({r['candidate'] for r in again}))}: run again ({why})", file=sys.stderr)
    for r in stops.rows:
        if r.get("reason") not in BROKEN:
            continue
        if r["candidate"] in lineup.baseline_names:
            raise BaselineBroken(f"{r['detail']}; the baseline broke, so no candidate can be judged: fix it, "
                                 f"then rerun with --retry-broken (every finished row is kept in {run_dir})")
        print(f"decodegate: {r['candidate']}: left out of this run ({r['detail']}); "
              f"to run it again: --retry-broken", file=sys.stderr)


def progress_bar(stages: list, lineup: Lineup, ledger: Ledger, progress: bool):
    from tqdm import tqdm
    total = sum(runs_on(s, w.suite.name) for st in stages for w in st for s in lineup.specs)
    return tqdm(total=total, initial=sum(1 for st in stages for w in st for s in lineup.specs
                                         if w.key(s.name) in ledger.done),
                desc="generating", unit="gen", disable=not progress, dynamic_ncols=True)


def pending_work(stage: list, lineup: Lineup, ledger: Ledger, bar) -> list:
    """The stage's work items, each with the decoders that still have to run it."""
    pending = [(w, [s for s in lineup.specs if ledger.wanted(s, w)]) for w in stage]
    skipped = sum(runs_on(s, w.suite.name) and w.key(s.name) not in ledger.done for w in stage
                  for s in lineup.specs) - sum(len(specs) for _, specs in pending)
    bar.total -= skipped  # stopped candidates: their remaining items will not run
    return [(w, specs) for w, specs in pending if specs]


def blocks(pending: list, size: int) -> list:
    return [pending[start:start + size] for start in range(0, len(pending), size)]


def block_order(specs: list, baseline_names: set, block_no: int) -> list:
    """The decoders' order in block `block_no`: each baseline first (a candidate's hang limit and
    divergence check read the baseline's row on the item), then the decoders of its level in an
    order shuffled anew each block (seeded by the block's number in this run). A fixed order
    is a bias: what runs just before a decoder (a server just woken, a neighbour's server still
    busy) lands on it every time. On vLLM the A/A run, always right after the baseline on the
    same server, read 1.06x the baseline (95% interval [1.04, 1.08]) over 74 items, TTFT and
    every token's time alike."""
    import random
    levels: list[list] = []
    for spec in specs:
        if spec.name in baseline_names or not levels:
            levels.append([spec])
        else:
            levels[-1].append(spec)
    shuffle = random.Random(block_no).shuffle
    out = []
    for head, *rest in levels:
        shuffle(rest)
        out += [head, *rest]
    return out


def run_decoder(ctx: Context, spec: DecoderSpec, block: list) -> None:
    """One decoder's requests of a block, all in flight at once (an engine) or one by one: a
    baseline first takes what the store supplies; each row is written as it finishes."""
    ledger, lineup = ctx.ledger, ctx.lineup
    items = [w for w, specs in block if spec in specs and ledger.wanted(spec, w)]
    if not items:
        return
    target = lineup.targets[spec.name]
    requests = [make_request(ctx.config, target, w) for w in items]
    found = [None] * len(items)
    if ctx.take.takes_from(spec):
        items, requests, found, taken = ctx.take.take(spec, items, requests)
        for w, row in taken:
            ledger.write(spec, w, row)
            ctx.bar.update(1)
        if not items:
            return
    w0 = items[0]
    ctx.bar.set_postfix_str(f"{spec.name} · {w0.suite.name}/{w0.item.id} · T={w0.temperature:g}"
                            + (f" (+{len(items) - 1})" if len(items) > 1 else ""), refresh=False)
    base = spec.name in ledger.base_names
    limits = [item_limit(ctx.policy, ledger.slowest_baseline_wall() if base else ledger.baseline_wall(w))
              for w in items]
    limit = None if None in limits else sum(limits)
    batch = Batch(spec, items, requests, found, vocabulary(target))
    worker = lineup.workers.get(spec.name)
    # A worker is bounded by the parent (it is killed past the limit). An engine's client cancels
    # its requests at the limit (the decoder's stop, the run goes on); the watchdog, GRACE_S later,
    # ends the run only where the client itself does not come back.
    backstop = None if worker is not None or limit is None else limit + GRACE_S
    with ctx.inflight.item(spec.name, items, backstop, lineup.fingerprints[spec.name]):
        if worker is not None:
            worker_rows(ctx, batch, worker, limit)
        else:
            generate_rows(ctx, batch, lineup.decoders[spec.name], limit)
    last = getattr(dict.get(lineup.decoders, spec.name), "last_batch", None)
    if last and last.get("proposed"):
        ledger.batches.write({"candidate": spec.name, **last})


@dataclass
class Batch:
    """One decoder's requests of a block: the work items, their requests, what the store found
    for each (a baseline's), and the target's vocabulary size (garbage is judged by it)."""
    spec: DecoderSpec
    items: list
    requests: list
    found: list
    vocab: int | None


def worker_rows(ctx: Context, batch: Batch, worker, limit: float | None) -> None:
    """The requests through the decoder's worker; each answer validated here and written. A break
    (raised, broke the contract, died, hung) is the decoder's stop; with --keep-going a raise
    fails only its item and the rest go on."""
    left = list(range(len(batch.items)))
    while left:
        answered = []
        for kind, j, payload in worker.run([batch.requests[i] for i in left], limit):
            i = left[j]
            answered.append(i)
            if kind in ("result", "item-error", "garbage"):
                record(ctx, batch.spec, batch.items[i], answer(kind, payload, batch.requests[i], batch.vocab),
                       batch.found[i])
            elif not broke(ctx, batch, i, kind, payload):
                return
        left = [i for i in left if i not in answered]


def generate_rows(ctx: Context, batch: Batch, decoder, limit: float | None) -> None:
    """In process (an engine decoder): generate and write each item's row: a result, a per-item
    error, or a result that cannot be judged (named as such). A candidate's own engine that stops
    answering makes its unanswered items errors; the baseline's raises EngineDown. A block still
    unanswered at `limit` seconds is the decoder's stop as hung, as a worker's would be."""
    from decoders.engines.client import Overdue
    from harness.run.worker import Death, exc_info
    spec, items, answered = batch.spec, batch.items, set()
    decoder.deadline = None if limit is None else time.monotonic() + limit
    decoder.last_batch = {}   # a batch cut short leaves none: not the block before's again
    try:
        if getattr(decoder, "engine_down", None):
            raise decoder.engine_down
        for i, result in results(decoder, batch.requests, ctx.policy.keep_going):
            answered.add(i)
            if isinstance(result, Overdue):
                broke(ctx, batch, i, "died", Death(f"no result after {limit:.3g} s: {result}", "", hung=True))
                break
            if isinstance(result, Exception) and not isinstance(result, DecoderError):
                if not broke(ctx, batch, i, "raised", exc_info(result, decoder)):
                    break  # the candidate stops here
                continue
            elif not isinstance(result, DecoderError) and (why := garbage(result, batch.requests[i], batch.vocab)):
                result = DecoderError(f"a result that cannot be judged: {why}")
            record(ctx, spec, items[i], result, batch.found[i])
    except EngineDown as e:
        if not candidate_alone_on(ctx, spec):
            raise  # the baseline's engine: nothing left to compare against; the run stops to resume
        # A candidate's own engine died (e.g. a request that kills it): its items are errors
        # naming why, and the run goes on with the others.
        if not getattr(decoder, "engine_down", None):
            print(f"decodegate: {spec.name}: {str(e).splitlines()[0]}; its items are errors", file=sys.stderr)
        decoder.engine_down = e
        for i, w in enumerate(items):
            if i not in answered:
                record(ctx, spec, w, DecoderError(str(e)), batch.found[i])
    finally:
        decoder.deadline = None  # the later stages (lm-eval, the exactness windows) are not this block


def record(ctx: Context, spec: DecoderSpec, w: WorkItem, result, found) -> None:
    """Write one generated row; a baseline row goes to the store side, a candidate's to --fail-fast."""
    ledger = ctx.ledger
    row = {**make_row(spec, w, result, block=ctx.block_no), **ctx.lineup.fingerprints[spec.name]}
    if spec.name in ledger.base_names and ctx.take.in_sample(w):
        row["speed_sample"] = True
    ledger.write(spec, w, row)
    ctx.bar.update(1)
    if spec.name in ledger.base_names:
        ctx.take.generated(spec, w, row, found)
    elif ctx.fail_fast:
        check_divergence(ctx.config, ctx.lineup.targets[spec.name], spec, row, ledger)


def candidate_alone_on(ctx: Context, spec: DecoderSpec) -> bool:
    """A candidate whose engine neither the baseline nor its A/A run uses."""
    base = ctx.config.baseline.options
    return spec.name not in ctx.ledger.base_names and spec.options.get("engine") not in (
        base.get("engine"), base.get("aa_engine"))


def broke(ctx: Context, batch: Batch, i: int, kind: str, payload) -> bool:
    """A decoder broke on item `i`: raised (`payload`: harness.run.worker.exc_info), broke the
    generate_many contract (why), or its worker died or hung (a Death). A candidate: its stop row
    (the one line, the traceback in the run folder), or, where it only raised and with
    `keep_going`, the item's error (True: go on). The baseline: the run stops (BaselineBroken), or,
    where the exception came from decodegate's own code, exit 3 names the bug."""
    from harness.run.faults import crashed
    ledger, spec, w = ctx.ledger, batch.spec, batch.items[i]
    args = (ledger.run_dir, ledger.ran(spec.name), ledger.planned[spec.name], ctx.lineup.fingerprints[spec.name])
    if kind == "contract":
        payload = {"exception": "ContractError", "message": payload, "at": "generate_many", "ours": False,
                   "contract": True, "traceback": payload + "\n"}
    stop = crashed(spec.name, w, payload, *args) if kind == "died" else raised(spec.name, w, payload, *args)
    where = f"traceback in {ledger.run_dir / stop['traceback']}"
    if spec.name in ledger.base_names:
        if stop.get("ours"):
            raise RuntimeError(f"{stop['detail']} ({where})")
        ledger.stops.add(**stop)  # remembered: the next run stops too, until --retry-broken or a fix
        raise BaselineBroken(f"{stop['detail']}; the baseline broke, so no candidate can be judged ({where}; "
                             f"every finished row is kept in {ledger.run_dir})")
    print(f"decodegate: {stop['detail']} ({where})", file=sys.stderr)
    if kind == "died" and payload.hung and payload.tail:
        print(f"the worker's Python stack when it was stopped:\n{payload.tail}", file=sys.stderr)
    if ctx.policy.keep_going and kind == "raised":
        if w.key(spec.name) not in ledger.done:  # not after its row (a raise past its last answer)
            record(ctx, spec, w, DecoderError(stop["detail"]), batch.found[i])
        return True
    ledger.stops.add(**stop)
    return False


def under_floor(spec: DecoderSpec, engines: dict | None = None) -> bool:
    """A decoder with more than one request in flight, at a sweep's level (harness.run.sweep) or by
    its engine table's `concurrency`: the A/A floor judges its identity."""
    engine = (engines or {}).get(spec.options.get("engine"))
    return (spec.options.get("concurrency") or getattr(engine, "concurrency", None) or 1) > 1


def check_divergence(config: RegressConfig, target, spec: DecoderSpec, row: dict, ledger: Ledger) -> None:
    """--fail-fast: stop an exact candidate at its first real divergence from the baseline. Not an
    engine's under concurrency: there a divergence within the engine's own A/A noise is no fault,
    and only the floor, after the run, can tell (harness.verdict.floor)."""
    if not _checks_identity(spec, row) or ledger.stops.stopped(spec.name, "*") or under_floor(spec, config.engines):
        return
    base = ledger.base_rows.get(record_key(row)[1:])
    why = base is not None and _real_divergence(config, target, base, row)
    if why:
        ledger.stops.add(candidate=spec.name, suite="*", reason="fail-fast", detail=why)
        print(f"decodegate: {spec.name}: stopped (--fail-fast): {why}", file=sys.stderr)


def look(looks, run_dir: Path, stops: Stops) -> None:
    """After a stage of a sequential design: stop the candidates whose quality is decided."""
    for st in (looks.decisions(read_records(run_dir), stops) if looks is not None else ()):
        stops.add(**st)
        print(f"decodegate: {st['candidate']}: {st['detail']}", file=sys.stderr)


class LmEvalSuite:
    """What the summary needs to know of an lm-eval task run as a suite. `select` gives the item
    ids the records carry ("3", or "subtask:3" in a group), so that look sets
    (harness.verdict.looks) match the pairs; they are plain strings, not prompt items, so the
    checks that rebuild requests from items (harness.run.exactness) pass them by."""

    def __init__(self, name: str, rows: list[dict]):
        self.name = name
        base = rows[0] if rows else {}
        self.version = base.get("suite_version", "?")
        self.hash = base.get("suite_hash", "?")
        self._ids = sorted({str(r["item_id"]) for r in rows})

    def select(self, subset) -> list[str]:
        return list(self._ids)


def check_lmeval(config: RegressConfig) -> None:
    """Pre-flight of the profile's `lmeval:<task>` suites, before any model loads or anything
    generates (they run after every other suite): each task resolves and builds, and one that
    executes generated code runs only where its table says `allow_code = true`; an LmEvalError
    (input error) naming the task otherwise. A decoder's options are its worker's, as for every
    suite: lm-eval generates through the decoder the run built."""
    names = [n for n in config.profile.suites if n.startswith("lmeval:")]
    if not names:
        return
    from harness.run.lmeval import check_task
    for name in names:
        spec_s = config.suites[name]
        check_task(name[len("lmeval:"):], spec_s.include_path, allow_code=spec_s.allow_code)


def lmeval_units(config: RegressConfig, lineup: Lineup) -> list[tuple]:
    """(suite, seed, temperature, spec) of every lm-eval run the profile asks for: a task at T > 0
    only on a sampled suite, and at T = 0 under the first seed only."""
    units = []
    for name in (n for n in config.profile.suites if n.startswith("lmeval:")):
        for t in config.profile.temperatures:
            if t > 0 and name not in config.profile.sample_suites:
                continue
            for seed in (config.profile.seeds[:1] if t == 0 else config.profile.seeds):
                units += [(name, seed, t, spec) for spec in lineup.specs if runs_on(spec, name)]
    return units


def run_lmeval(config: RegressConfig, run_dir: Path, lineup: Lineup, progress: bool = True) -> list:
    """`lmeval:<task>` suites: each decoder runs the task through lm-eval (generation through our
    decoder), and its per-sample records join records.jsonl like any other suite's."""
    # A task counts as done for a decoder only once its completion marker is written and the
    # folder holds the rows it counts: a run killed inside lm-eval, or rows dropped since (a
    # decoder run again after a fix), reruns that task from the start (its rows are replaced).
    done = lmeval_finished(run_dir)
    for name, seed, t, spec in lmeval_units(config, lineup):
        # A decoder stopped on the task (a look, or it broke: raised, crashed, failed to load,
        # here or before) runs no more of it; the exit code says whether that stop is excused.
        stopped = {(r["candidate"], r["suite"]) for r in read_records(run_dir, STOPS)}
        if {(spec.name, "*"), (spec.name, name)} & stopped:
            continue
        if (spec.name, name, seed, t) not in done:
            n = _run_lmeval_unit(config, run_dir, lineup, (name, seed, t, spec), progress)
            if n is None:
                continue  # it broke: its stop row is written, and no marker
            marker = RecordWriter(run_dir, LMEVAL_DONE)  # opened after the unit's rewrite of records
            marker.write({"candidate": spec.name, "suite": name, "seed": seed, "temperature": t, "rows": n})
            marker.close()
    names = [n for n in config.profile.suites if n.startswith("lmeval:")]
    rows = read_records(run_dir)
    return [LmEvalSuite(name, [r for r in rows if r["suite"] == name]) for name in names]


def stage_broke(run_dir: Path, lineup: Lineup, name: str, broke: Broke, at: tuple) -> None:
    """A decoder broke in its worker in a stage after generation (`at`: suite, item, seed, T):
    its stop row, as in generation (a candidate's verdict FAIL, remembered by the next run); the
    baseline's stops the run."""
    from types import SimpleNamespace
    from harness.run.faults import crashed
    suite, item, seed, t = at
    w = WorkItem(SimpleNamespace(name=suite), SimpleNamespace(id=item), t, seed)
    plan = json.loads((Path(run_dir) / PLAN).read_text()) if (Path(run_dir) / PLAN).exists() else {}
    args = (run_dir, sum(r["candidate"] == name for r in read_records(run_dir)),
            sum(key[0] == name for key in plan.get("rows", [])), lineup.fingerprints[name])
    payload = broke.payload
    if broke.kind == "contract":
        payload = {"exception": "ContractError", "message": payload, "at": "generate_many", "ours": False,
                   "contract": True, "traceback": payload + "\n"}
    stop = crashed(name, w, payload, *args) if broke.kind == "died" else raised(name, w, payload, *args)
    stops = Stops(run_dir)
    stops.add(**stop)
    stops.close()
    where = f"traceback in {Path(run_dir) / stop['traceback']}"
    if name in lineup.baseline_names:
        raise BaselineBroken(f"{stop['detail']}; the baseline broke, so no candidate can be judged ({where}; "
                             f"every finished row is kept in {run_dir})")
    print(f"decodegate: {stop['detail']} ({where})", file=sys.stderr)


def lmeval_finished(run_dir: Path) -> set[tuple]:
    """The (decoder, suite, seed, temperature) lm-eval runs whose marker counts exactly the rows
    the folder holds for them (what harness.verdict.exit_code accepts as finished)."""
    unit = lambda r: (r.get("candidate"), r.get("suite"), r.get("seed"), r.get("temperature"))  # noqa: E731
    held = {}
    for r in read_records(run_dir):
        held[unit(r)] = held.get(unit(r), 0) + 1
    return {unit(m) for m in read_records(run_dir, LMEVAL_DONE)
            if type(m.get("rows")) is int and m["rows"] == held.get(unit(m), 0)}


def _run_lmeval_unit(config: RegressConfig, run_dir: Path, lineup: Lineup, unit: tuple, progress: bool) -> int | None:
    """One decoder through one lm-eval task at one seed and temperature, generating in its worker;
    its rows replace any a killed run left, and any marker of it that no longer holds. The number
    of rows written, or None where the decoder broke (its stop row written instead)."""
    from harness.run.lmeval import LmEvalEmpty, lmeval_records
    name, seed, t, spec = unit
    spec_s, task = config.suites[name], name[len("lmeval:"):]
    if progress:
        print(f"decodegate: lm-eval {task} · {spec.name} · T={t:g}", flush=True)
    try:
        rows = lmeval_records(task, lineup.targets[spec.name], spec.decoder, dict(spec.options),
                              candidate=spec.name, seed=seed, temperature=t, limit=spec_s.limit,
                              include_path=spec_s.include_path,
                              gen_kwargs={"max_gen_toks": spec_s.max_gen_toks} if spec_s.max_gen_toks else None,
                              confirm_run_unsafe_code=spec_s.allow_code, generator=lineup.decoders[spec.name])
    except LmEvalEmpty as e:  # no rows: the summary fails its gate with "no items"
        print(f"decodegate: warning: {e}", file=sys.stderr)
        rows = []
    except Broke as e:
        stage_broke(run_dir, lineup, spec.name, e, (name, f"request {lineup.decoders[spec.name].requests}", seed, t))
        return None
    same = lambda r: (r.get("candidate"), r.get("suite"), r.get("seed"), r.get("temperature")) == (spec.name, name, seed, t)  # noqa: E731
    if any(same(r) for r in read_records(run_dir)):
        _drop_rows(run_dir, same)
    if any(same(m) for m in read_records(run_dir, LMEVAL_DONE)):
        _rewrite(Path(run_dir) / LMEVAL_DONE, [m for m in read_records(run_dir, LMEVAL_DONE) if not same(m)])
    writer = RecordWriter(run_dir)  # opened after any rewrite above
    for row in rows:
        row.setdefault("kind", spec.kind)
        writer.write(row)
    writer.close()
    return len(rows)


def broken(run_dir: Path) -> set[str]:
    """The decoders that broke in an earlier run on this folder: a stop for raising, crashing or
    hanging, or the in-flight note of a run that died."""
    names = {r["candidate"] for r in read_records(run_dir, STOPS) if r.get("reason") in BROKEN}
    return names | {in_flight(run_dir)} - {None}


def forget(run_dir: Path, names: set[str]) -> None:
    """Drop the rows, the lm-eval markers, the broken stops and the in-flight note of decoders run
    again after a fix."""
    _drop_rows(run_dir, lambda r: r["candidate"] in names)
    if (Path(run_dir) / LMEVAL_DONE).exists():
        _rewrite(Path(run_dir) / LMEVAL_DONE, [m for m in read_records(run_dir, LMEVAL_DONE)
                                                if m.get("candidate") not in names])
    path = Path(run_dir) / STOPS
    if path.exists():
        _rewrite(path, [r for r in read_records(run_dir, STOPS)
                        if not (r["candidate"] in names and r.get("reason") in BROKEN)])
    if in_flight(run_dir) in names:
        (Path(run_dir) / INFLIGHT).unlink()


def _drop_rows(run_dir: Path, drop) -> None:
    """Rewrite records.jsonl without the rows `drop` selects (a half-finished lm-eval task)."""
    _rewrite(Path(run_dir) / RECORDS, [r for r in read_records(run_dir) if not drop(r)])


def _rewrite(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)
