"""Run the regression: baseline vs candidates on the suites, analysis, gates, report, MLflow.

Writes a run folder (records.jsonl, summary.json, per_prompt.csv, report.txt, report.md, figures/),
the source of truth; MLflow gets a copy (harness.run.tracking), CI gets --junit-xml and
--summary-md. Rerunning with the same --run-dir resumes: finished generations are not run again
(refused when the models' fingerprints changed). Before any model loads it prints the sample-size plan (harness.verdict.power). Baseline rows come from the store
where their content key matches (harness.run.store), except a freshly timed subset. Exit code 0
when every gate passes, 1 when one fails, 2 on a usage or input error (the CI files do not change
it).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from harness.run.faults import HANG_FACTOR, HANG_FLOOR_S, Policy
from harness.run.records import read_records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="regress.toml", help="regress config (TOML; default: %(default)s)")
    p.add_argument("--profile", default="smoke", help="a profile defined in the config; the shipped one has "
                                                       "smoke, decide (the lossy candidates' quality verdict) and "
                                                       "full (default: %(default)s)")
    p.add_argument("--run-dir", help="run folder; an existing one is resumed: finished generations are "
                                     "skipped (default: runs/<time>-<profile>)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--baseline-store", metavar="DIR|mlflow:RUN_ID|none",
                   help="where baseline generations are kept by content key and reused from: a folder, a logged "
                        "run's artifacts (read-only), or none (default: <user cache>/decodegate/baselines)")
    p.add_argument("--fresh-baseline", action="store_true",
                   help="generate the whole baseline again (it is still written to the store)")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop an exact candidate at its first real divergence (its verdict is a failure)")
    p.add_argument("--keep-going", action="store_true",
                   help="a candidate that raises goes on with its other items (each item it raises on fails); "
                        "by default it stops at its first exception, and its verdict is a failure")
    p.add_argument("--retry-broken", action="store_true",
                   help="run again the decoders that raised, crashed or hung in an earlier run on this --run-dir "
                        "(by default they are named and left out, unless their code or model changed)")
    p.add_argument("--item-timeout", type=positive, metavar="S",
                   help="end the run when one item takes longer than S seconds (the decoder, the item and its "
                        "Python stack are named; the next run on the folder goes on without that decoder)")
    p.add_argument("--hang-factor", type=positive, default=HANG_FACTOR, metavar="F",
                   help=f"a candidate's item counts as hung after F times the baseline's time on it (at least "
                        f"{HANG_FLOOR_S:g} s; default: %(default)g)")
    p.add_argument("--worker-memory", type=positive, metavar="GB",
                   help="cap each decoder's worker process at GB gibibytes of address space beyond what it starts "
                        "with (RLIMIT_AS); a decoder that exceeds it fails as crashed, out of memory")
    p.add_argument("--plan-from", metavar="RUN_DIR",
                   help="a previous run folder: plan sample sizes from the discordance it observed")
    p.add_argument("--plan-only", action="store_true",
                   help="print the sample-size plan (what each gated suite needs, what the profile runs) and exit")
    p.add_argument("--junit-xml", metavar="PATH", help="write JUnit XML: one testcase per gate, a failed gate a "
                                                        "failure with its detail (exit codes are unchanged)")
    p.add_argument("--summary-md", metavar="PATH", help="write the verdict table and gates in Markdown; also "
                                                         "appended to $GITHUB_STEP_SUMMARY when that is set")


def positive(text: str) -> float:
    """A positive, finite number (argparse names the option on a ValueError)."""
    x = float(text)
    if not (0 < x < float("inf")):
        raise ValueError(text)
    return x


def code_version() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        sha = ""
    from importlib.metadata import PackageNotFoundError, version
    try:
        v = version("decodegate")
    except PackageNotFoundError:
        v = "dev"
    return f"{v}+{sha}" if sha else v


def fingerprint(config_path: str, profile: str, suites) -> str:
    """Config, profile and suite contents: a resumed run must not mix rows from other prompts."""
    h = hashlib.sha256(Path(config_path).read_bytes() + profile.encode())
    for s in suites:
        h.update(f"{s.name}:{s.hash}".encode())
    return h.hexdigest()[:16]


def forget_if_nothing_ran(run_dir: Path) -> None:
    """Remove the run record of a folder where no generation finished (keep everything else)."""
    if not read_records(run_dir):
        for name in ("run.json", "config.toml"):
            (run_dir / name).unlink(missing_ok=True)


def open_run_dir(args, config, suites) -> tuple[Path, dict]:
    """Create or resume a run folder; refuse to resume one made from another config or suites."""
    from harness.config import ConfigError
    fp = fingerprint(args.config, args.profile, suites)
    run_dir = Path(args.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{args.profile}")
    meta_path = run_dir / "run.json"
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except (ValueError, OSError) as e:
            meta = None
            why = str(e)
        else:
            why = "no fingerprint or run_uid"
        if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), str) \
                or not isinstance(meta.get("run_uid"), str):
            # Resuming needs the folder's own record; nothing in the folder is touched.
            raise ConfigError(f"{meta_path} is not a decodegate run record ({why}); use a new --run-dir")
        if meta["fingerprint"] != fp:
            raise ConfigError(f"{run_dir} was made from another config, profile or suite version; "
                              f"use a new --run-dir")
        return run_dir, meta
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file, not a folder")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a part of the path is a file, or not writable
        raise ConfigError(f"cannot create the run folder {run_dir}: {e.strerror or e}") from None
    # The config's absolute path: `sync` run from another folder finds it, and the suite files
    # beside it, to put the prompts in MLflow's tables and traces (harness.run.review.prompts).
    meta = {"run_uid": uuid.uuid4().hex, "fingerprint": fp, "config": str(Path(args.config).resolve()),
            "profile": args.profile,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "code_version": code_version()}
    meta_path.write_text(json.dumps(meta, indent=2))
    (run_dir / "config.toml").write_bytes(Path(args.config).read_bytes())
    return run_dir, meta


def run(args) -> int:
    # The last run's CI files are replaced by a no-verdict failure before anything can refuse (a
    # bad name in the config, an unreachable reference, --plan-only): a run that stops before its
    # verdict must not leave the previous run's green JUnit for CI's reporters. The paths do not
    # depend on the config.
    from harness.verdict import report
    ci = getattr(args, "junit_xml", None), getattr(args, "summary_md", None)
    report.check_ci_paths(*ci)
    report.placeholder_ci(*ci)
    checked = check_input(args)
    if checked is None:  # --plan-only
        return 0
    config, suites, refs, plan = checked
    from harness.run.store import open_store
    store = open_store(getattr(args, "baseline_store", None), getattr(args, "fresh_baseline", False), args.tracking_uri)
    run_dir, meta = open_run_dir(args, config, suites)
    print(f"decodegate: run folder {run_dir}", file=sys.stderr)
    from harness.run.engines import started
    # An engine that cannot start (a launch that dies with SIGILL, a wrong model) or a decoder that
    # cannot be built: nothing ran, so the folder must not hold this config's fingerprint and
    # refuse the corrected one, nor look like a run (engine logs stay, to be read).
    with started(config, run_dir, on_failed_start=lambda: forget_if_nothing_ran(run_dir)) as servers:
        meta, records, suites, checks = generate(args, config, suites, run_dir, meta, store, servers)
        meta = {**meta, "plan": plan}
    return finish(config, run_dir, meta, records, suites, checks["exactness"], args, checks["head_cost"],
                  checks["numerics"], refs)


def check_input(args):
    """Everything that can be wrong with the input, found before any model is loaded: (config,
    suites, acceptance references, sample-size plan), or None after --plan-only's table."""
    from harness.config import load_config
    config = load_config(args.config, args.profile)
    from harness.run import runner
    suites = runner.load_suites(config)
    # lm-eval tasks run after every other suite: a misspelt task, a wrong include_path or a code
    # task not allowed by the config is refused now, not after hours of generation.
    runner.check_lmeval(config)
    from decoders.base import DecoderError, get_decoder_class, is_builtin
    from harness.run.worker import probe_import
    for spec in (config.baseline, *config.candidates):
        # A team's module is tried in a child first: decodegate imports it itself from here on.
        why = None if is_builtin(spec.decoder) else probe_import(spec.decoder)
        if why:
            raise DecoderError(f"{spec.name!r} (decoder {spec.decoder!r}): {why}; decodegate imports a decoder's "
                               f"module itself (its options, its code fingerprint), so it must import cleanly")
        get_decoder_class(spec.decoder)
    from harness.verdict import acceptance_ref
    # A reference on other prompts or target is refused now; the one loaded here is the one compared
    # at the end (the tracking server may be down by then, or hold a newer run).
    refs = acceptance_ref.check(config, suites, args.tracking_uri)
    from harness.verdict import power
    plan = power.plan(config, suites, getattr(args, "plan_from", None))
    print(power.table(plan, config), file=sys.stderr)
    from harness.run.sweep import is_engine
    if is_engine(config.baseline) and any(c.kind == "exact" and is_engine(c) for c in config.candidates):
        from harness.verdict.floor import plan_table
        print(plan_table(config, suites, getattr(args, "plan_from", None)), file=sys.stderr)
    return None if getattr(args, "plan_only", False) else (config, suites, refs, plan)


def generate(args, config, suites, run_dir: Path, meta: dict, store, servers) -> tuple:
    """The generation stage: the lineup (each decoder's worker), the records, then the checks that
    run after it (lm-eval tasks, load, exactness windows, margin noise). (meta, records, suites,
    checks)."""
    from decoders.engines.server import EngineDown
    from harness.run import runner
    try:
        lineup = runner.Lineup(config, servers, worker_memory=getattr(args, "worker_memory", None),
                               protect=(Path(run_dir).resolve(),))
    except ValueError:
        forget_if_nothing_ran(run_dir)
        raise
    try:
        meta = check_fingerprints(run_dir, meta, lineup)
        from harness.run.reuse import Reuse
        reuse = Reuse(store, lineup, run_dir, meta["run_uid"])
        from harness.verdict.looks import LookPlan
        looks = LookPlan(config, lineup.specs, lineup.baseline_names, suites)
        records = runner.run(config, run_dir, lineup, suites, progress=not args.no_progress, reuse=reuse,
                             fail_fast=getattr(args, "fail_fast", False), looks=looks, policy=policy(args))
        suites, records, checks = after_generation(args, config, run_dir, lineup, suites, records, servers)
    except EngineDown as e:
        kept = len(read_records(run_dir))
        raise EngineDown(f"{e}\n{kept} finished records are kept in {run_dir}; once the engine is back, "
                         f"rerun with --run-dir {run_dir} to resume") from None
    finally:
        lineup.close()  # the workers: the stages after generation ask them too
    meta = {**meta, "engines": {name: server.info for name, server in servers.items()},
            "baseline_store": store_summary(reuse, records, lineup)}
    return meta, records, suites, checks


def after_generation(args, config, run_dir: Path, lineup, suites, records, servers) -> tuple:
    """lm-eval tasks, load levels, exactness windows and margin noise, in this process."""
    from harness.run import runner
    progress = not args.no_progress
    if any(n.startswith("lmeval:") for n in config.profile.suites):
        suites = suites + runner.run_lmeval(config, run_dir, lineup, progress=progress)
        records = read_records(run_dir)
    if config.profile.load is not None:  # open-loop arrivals at each rate (harness.run.load)
        from harness.run import load as load_run
        load_run.run(config, run_dir, lineup, suites, progress=progress)
    from harness.run import exactness as exactness_run
    exactness = exactness_run.run_checks(config, run_dir, lineup, suites, progress=progress)
    from harness.run import engine_exactness
    exactness.update(engine_exactness.run_checks(config, run_dir, lineup, suites, servers, progress=progress))
    numerics = exactness_run.margin_noise(config, lineup, suites, records)
    from harness.models import lm_head_cost_in_layers
    head_cost = {s.name: lm_head_cost_in_layers(lineup.targets[s.name].model) for s in lineup.specs
                 if s.decoder == "early-exit"}
    return suites, records, {"exactness": exactness, "head_cost": head_cost, "numerics": numerics}


def policy(args) -> Policy:
    """What the runner does when a decoder breaks (harness.run.faults)."""
    return Policy(keep_going=getattr(args, "keep_going", False), retry=getattr(args, "retry_broken", False),
                  item_timeout=getattr(args, "item_timeout", None),
                  hang_factor=getattr(args, "hang_factor", None) or HANG_FACTOR)


def check_fingerprints(run_dir: Path, meta: dict, lineup) -> dict:
    """A resumed run folder must hold rows of the same models and decoder code: refuse one made
    with others (rows of a fixed decoder beside rows of the broken one would be judged as one)."""
    from harness.config import ConfigError
    now = lineup.fingerprints
    before = meta.get("fingerprints")
    if before is not None:
        changed = {name: f"{name} {k.replace('_fingerprint', '')} {v} -> {now[name].get(k)}"
                   for name, fp in before.items() if name in now for k, v in fp.items() if now[name].get(k) != v}
        from harness.run.runner import broken, forget
        if changed and set(changed) <= broken(run_dir) - lineup.baseline_names:
            # Only decoders that broke here changed (a fix): their rows go, and they run again.
            forget(run_dir, set(changed))
            print(f"decodegate: {', '.join(sorted(changed))}: changed since it broke ({'; '.join(changed.values())}); "
                  f"its rows are dropped and it runs again", file=sys.stderr)
            meta = {**meta, "fingerprints": {**before, **{n: now[n] for n in changed}}}
            (run_dir / "run.json").write_text(json.dumps(meta, indent=2))
        elif changed:
            changed = list(changed.values())
            raise ConfigError(f"{run_dir} was made with other models or decoder code ({'; '.join(changed)}): its "
                              f"rows cannot be mixed with these; use a new --run-dir")
        return meta
    meta = {**meta, "fingerprints": now}
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2))
    return meta


def store_summary(reuse, records, lineup) -> dict:
    """How much of the baseline came from the store, and from where."""
    out = reuse.summary()
    base = [r for r in records if r["candidate"] in lineup.baseline_names]
    out["baseline_rows"] = len(base)
    out["reused_rows"] = sum(1 for r in base if r.get("reused"))
    out["from_runs"] = sorted({r["reused"].get("run_uid") or "?" for r in base if r.get("reused")})
    from harness.run.speed_sample import composition, rests_on
    first = next(s.name for s in lineup.specs if s.name in lineup.baseline_names)  # each level times the same items
    timed = rests_on([b for b in base if b["candidate"] == first])
    out["speed_sample"] = {"n": len(timed), "by_suite": composition(timed), "seed": out.get("speed_seed"),
                           "sampled": out["reused_rows"] > 0}
    return out


def summarize_levels(config, records, suites, exactness, head_cost=None, numerics=None, stops=None) -> dict:
    """One summary over every concurrency level: each level's candidates are paired with that
    level's baseline, exact candidates are judged against that level's A/A floor."""
    from harness.verdict import floor
    from harness.run import sweep
    from harness.verdict.summary import summarize
    summary, parts, floors = None, [], []
    for level in sweep.levels(config):
        cfg = sweep.level_config(config, level)
        part = summarize(cfg, records, suites, exactness, lm_head_cost=head_cost, numerics=numerics, stops=stops)
        parts.append((cfg, part, level))
        aa = [c.name for c in cfg.candidates if c.role == "aa-floor"]
        if aa:
            floors.append((part, aa[0], [c.name for c in cfg.candidates if c.role != "aa-floor"]))
    floor.apply_levels(floors, config.gates)  # each candidate's blocks tested together: all pooled, and each level's
    for cfg, part, level in parts:
        for spec in cfg.candidates:
            part["candidates"][spec.name].update(role=spec.role, concurrency=level)
        if summary is None:
            summary = part
        else:
            summary["candidates"].update(part["candidates"])
    if sweep.levels(config) != [None]:
        summary["sweep"] = sweep.sweep_table(config, summary, records)
    return summary


def finish(config, run_dir: Path, meta: dict, records, suites, exactness, args, head_cost=None,
           numerics=None, refs=None) -> int:
    """The judging stage, over the records alone: the summary and its verdicts, the run folder's
    reports, CI's files, MLflow; then the exit code, read back from the run folder."""
    summary = build_summary(config, run_dir, meta, records, suites, exactness, args, head_cost, numerics, refs)
    judge(summary, config, run_dir)
    ci_written = write_reports(summary, records, run_dir, args)
    if not getattr(args, "no_tracking", False):
        track(run_dir, args)
    print(f"decodegate: results in {run_dir}", file=sys.stderr)
    from harness.verdict.exit_code import exit_code
    code, why = exit_code(run_dir)
    if why:
        print(f"decodegate: {why}", file=sys.stderr)
    return 2 if code == 0 and not ci_written else code  # a pass whose JUnit file CI cannot read is no clean pass


def build_summary(config, run_dir: Path, meta: dict, records, suites, exactness, args, head_cost, numerics,
                  refs) -> dict:
    """Every level's analysis, the stops, the acceptance reference and the run's own record."""
    from harness.run.runner import STOPS
    summary = summarize_levels(config, records, suites, exactness, head_cost, numerics,
                               stops=read_records(run_dir, STOPS))
    summary.update(run_uid=meta["run_uid"], created=meta["created"], code_version=meta["code_version"],
                   config=meta["config"])
    from harness.verdict import acceptance_ref
    acceptance_ref.attach(summary, config, records, suites, getattr(args, "tracking_uri", None), refs)
    summary["log_text"] = config.log_text
    summary["trace_limit"] = config.trace_limit
    for key in ("baseline_store", "plan", "fingerprints"):
        if meta.get(key) is not None:
            summary[key] = meta[key]
    if meta.get("engines"):
        summary["engines"] = meta["engines"]
        for cand in summary["candidates"].values():
            name = (cand.get("options") or {}).get("engine")
            if name in meta["engines"]:
                cand["engine"] = meta["engines"][name]
    return summary


def judge(summary: dict, config, run_dir: Path) -> None:
    """Each candidate's gates and verdict, the load verdict, and the run's verdict."""
    from harness.run.faults import BROKEN
    from harness.verdict.gate import decide
    all_pass = True
    for cand in summary["candidates"].values():
        if cand.get("role") == "aa-floor":
            cand["verdict"], cand["gates"] = "floor", []  # it measures the floor; it is not on trial
            broke = [st for st in cand.get("stopped", []) if st.get("reason") in BROKEN]
            if broke:  # the floor was not measured: no run passes on a broken measurement
                cand["gates"] = [{"name": "aa floor", "status": "fail", "detail": broke[0].get("detail") or "broke"}]
                all_pass = False
            continue
        decision = decide(cand, config.gates)
        cand["verdict"] = "pass" if decision.passed else "fail"
        cand["gates"] = [{"name": r.name, "status": r.status, "detail": r.detail} for r in decision.results]
        all_pass &= decision.passed
    # An A/A speedup whose interval excludes 1 is a biased clock: no speed gate passes on it.
    from harness.verdict import timing
    all_pass &= timing.apply(summary, config.gates)
    if config.profile.load is not None:  # latency under load, SLO gates, crossovers (harness.verdict.load)
        from harness.verdict import load as load_verdict
        all_pass &= load_verdict.apply(summary, config, run_dir)
    summary["verdict"] = "pass" if all_pass else "fail"


def write_reports(summary: dict, records, run_dir: Path, args) -> bool:
    """summary.json, per_prompt.csv, figures, report.txt/.md and CI's files; False where CI's
    files could not be written."""
    from harness.verdict import report
    if "sweep" in summary:
        from harness.run.sweep import figure
        (run_dir / "figures").mkdir(exist_ok=True)
        try:
            figure(summary["sweep"], run_dir / "figures" / "sweep.png")
        except Exception as e:  # noqa: BLE001 - a figure is never worth a run
            print(f"decodegate: warning: sweep figure not drawn ({e})", file=sys.stderr)
    # Strict JSON: a NaN left by a step that had nothing to measure (an A/A comparison over no
    # pairs) is null, not a `NaN` token that JavaScript readers and MLflow's viewer reject.
    from harness.verdict.plain import plain
    (run_dir / "summary.json").write_text(json.dumps(plain(summary), indent=2, allow_nan=False))
    report.per_prompt_csv(records, run_dir / "per_prompt.csv")
    report.figures(summary, records, run_dir)
    text = report.table(summary)
    (run_dir / "report.txt").write_text(text + "\n")
    (run_dir / "report.md").write_text(report.markdown(summary, text))  # MLflow's run description
    ci_written = True
    try:
        report.write_ci(summary, text, getattr(args, "junit_xml", None), getattr(args, "summary_md", None))
    except OSError as e:  # checked before the run; a full disk or a folder removed since
        ci_written = False
        print(f"decodegate: error: the CI files were not written ({e}); the verdict is in {run_dir}",
              file=sys.stderr)
    print(text)
    return ci_written


def track(run_dir: Path, args) -> None:
    """A copy in MLflow; the run folder has everything, so a failure here is a warning."""
    from harness.run import tracking
    try:
        tracking.log_run(run_dir, args.tracking_uri)
        print(f"decodegate: logged to MLflow at {tracking.resolve_uri(args.tracking_uri)}; review: "
              f"{json.loads((run_dir / tracking.STATE).read_text())['review_url']}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - tracking is a copy; the run folder has everything
        print(f"decodegate: warning: MLflow logging failed ({e}); results are kept in {run_dir}; "
              f"upload later with: decodegate sync {run_dir}", file=sys.stderr)
