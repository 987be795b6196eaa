"""The human-facing outputs of a regress run: a terminal table, a per-prompt CSV, figures."""
from __future__ import annotations

import csv
from pathlib import Path

from harness.markup import md_cell, md_code, md_fence, xml_text


def _fmt(x, spec=".2f", none="–"):
    return none if x is None else format(x, spec)


HEADER = ("candidate", "suite", "identity T=0", "quality delta (lower bound)", "speedup", "α / τ / layers",
          "verdict")


def _identity_cell(ident: dict | None) -> str:
    if not ident:
        return "–"
    return (f"{ident['identical']}/{ident['n']}" + (f" ({ident['near_ties']} tie)" if ident["near_ties"] else "")
            + (f" ({ident['errored']} errored)" if ident.get("errored") else ""))


def _quality_cell(q: dict | None) -> str:
    """The bound the gate decides on: one-sided, at the level of the non-inferiority test; under
    looks the repeated bound at the look's boundary."""
    if not q:
        return "–"
    seq = q.get("sequential")
    if seq and seq["looks"] and seq["looks"][-1].get("lower_bound") is not None:
        return f"{q['statistic']:+.3f} (>= {seq['looks'][-1]['lower_bound']:+.3f}, look {seq['look']}/{seq['of']})"
    return (f"{q['statistic']:+.3f} (>= {q['non_inferiority']['lower_bound']:+.3f}, "
            f"{1 - q['non_inferiority']['alpha']:.0%})")


def _suite_gates(cand: dict, suite: str) -> list[dict]:
    return [g for g in cand["gates"] if f" {suite} " in f" {g['name']} "   # whole words: not code in code_long
            or (suite == "refusal" and g["name"] == "refusal behaviour")]


def _worst(gates: list[dict]) -> str:
    return next((g["status"] for g in gates if g["status"] == "fail"),
                next((g["status"] for g in gates if g["status"] != "pass"), "pass" if gates else "–"))


def _all_cell(cand: dict) -> str:
    """The candidate's verdict, naming the gates that no suite row shows (speed, the A/A floor,
    coverage, ...) when one of them is what failed or warned: a row of "pass" and an ALL of "FAIL"
    then say why, rather than contradict each other."""
    if cand.get("verdict") == "floor":   # the A/A run: the noise the others are judged against
        return "A/A floor: BROKE" if any(g["status"] == "fail" for g in cand["gates"]) else "A/A floor, not judged"
    shown = {id(g) for suite in cand["suites"] for g in _suite_gates(cand, suite)}
    run_level = [g for g in cand["gates"] if id(g) not in shown and g["status"] != "pass"]
    parts = [f"{label}: {', '.join(dict.fromkeys(g['name'] for g in run_level if (g['status'] == 'fail') == failed))}"
             for label, failed in (("run-level fail", True), ("warn", False))
             if any((g["status"] == "fail") == failed for g in run_level)]
    return cand["verdict"].upper() + (f" ({'; '.join(parts)})" if parts else "")


def verdict_rows(summary: dict) -> list[tuple]:
    """The verdict table's rows (no header): per candidate and suite, then the candidate's ALL row."""
    rows = []
    for name, cand in summary["candidates"].items():
        for suite, s in cand["suites"].items():
            sp = s.get("speedup")
            sp_s = f"{sp['statistic']:.2f}x" if sp and "statistic" in sp else "–"  # not a step that lacked data
            extra = "–"
            if "acceptance" in s and "alpha" in s["acceptance"]:
                a = s["acceptance"]
                extra = f"α={_fmt(a['alpha'])} τ={_fmt(a['tau'])}"
            elif "mean_layers" in s.get("exits", {}):
                extra = f"{s['exits']['mean_layers']:.1f}/{s['exits']['num_layers']} layers"
            rows.append((name, suite, _identity_cell(s.get("identity", {}).get("T=0")), _quality_cell(s.get("quality")),
                         sp_s, extra, _worst(_suite_gates(cand, suite))))
        rows.append((name, "ALL", "", "", _speedup(cand.get("speedup")), "", _all_cell(cand)))
    return rows


def table(summary: dict) -> str:
    rows = [HEADER, *verdict_rows(summary)]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines)
    fails = [(n, g) for n, c in summary["candidates"].items() for g in c["gates"] if g["status"] != "pass"]
    if fails:
        out += "\n\n" + "\n".join(f"{g['status'].upper():5} {_named(n, g['name'], g['detail'])}" for n, g in fails)
    # Said beside the verdicts even where no speed gate turned on it: every speedup above is suspect.
    if (why := (summary.get("timing") or {}).get("why")):
        out += f"\n\n{why}"
    out += statistics_lines(summary)
    out += store_lines(summary)
    out += engine_lines(summary)
    out += sweep_lines(summary)
    from harness.verdict.load import lines as load_lines
    out += load_lines(summary)
    out += drift_lines(summary)
    out += f"\n\nverdict: {summary['verdict'].upper()}"
    return out


def store_lines(summary: dict) -> str:
    """Where the baseline came from, and what the sample-size plan said before the run."""
    lines = []
    st = summary.get("baseline_store")
    if st:
        fresh = st["baseline_rows"] - st["reused_rows"]
        where = st["store"] or "no store"
        line = (f"baseline: {st['reused_rows']} of {st['baseline_rows']} rows reused from {where}"
                + (f" (runs {', '.join(r[:8] for r in st['from_runs'])})" if st["from_runs"] else "")
                + f"; {fresh} generated in this run")
        if st["retimed"]:
            near = st.get("retimed_near_ties") or 0
            line += (f"; {st['retimed']} re-timed rows checked against the store: "
                     + (f"{len(st['retimed_disagreed'])} DIFFER ({', '.join(st['retimed_disagreed'][:3])})"
                        if st["retimed_disagreed"] else "all identical"
                        + (f" ({near} up to a near-tie)" if near else "")))
        if st["skipped"]:
            line += f"; {len(st['skipped'])} unreadable store row(s) skipped"
        lines.append(line)
        if st.get("reuse_refused"):
            lines.append(f"store rows not reused: {st['reuse_refused']}")
        sp = st.get("speed_sample")
        if sp:
            parts = ", ".join(f"{suite} {n}" for suite, n in sp["by_suite"].items())
            lines.append(f"speed rests on {sp['n']} items ({parts})"
                         + (f": a sample stratified over suites, by stored length within each (seed {sp['seed']}), timed beside "
                            f"the candidates; the rest of the baseline came from the store" if sp["sampled"]
                            else ": every baseline row, generated in this run"))
    for name, cand in summary["candidates"].items():
        for stop in cand.get("stopped", []):
            lines.append(f"stopped early: {_named(name, None, stop.get('detail', stop.get('reason')))}")
    return ("\n" + "\n".join(lines)) if lines else ""


def _named(name: str, gate: str | None, detail: str) -> str:
    """A line naming the candidate once: a broken candidate's line starts with its name already."""
    if str(detail).startswith(f"{name}: "):
        return detail
    return f"{name}: {gate}: {detail}" if gate else f"{name}: {detail}"


def bound_words(sp: dict) -> str:
    """The speedup's one-sided lower bound as what it means: a figure, or why there is none (the
    suite estimate's own reason; too few prompts; lengths too spread; an interval that reaches down
    to 0, which bounds nothing)."""
    from analysis.latency import MIN_PROMPTS
    bound, n = sp.get("lower_bound"), sp.get("n_prompts") or 0
    spread, limit = sp.get("length_log_sd"), sp.get("length_log_sd_limit")
    if bound is not None and bound > 0:
        return f">= {bound:.2f}x"
    if bound is not None:
        return f"no bound: the interval over {n} prompts reaches 0; more prompts narrow it"
    if sp.get("no_bound"):  # the suite's speedup from a timed subset names its own reason (suite_bounds)
        return f"no bound: {sp['no_bound']} ({n} of the suite's {sp.get('suite_prompts')} prompts timed)"
    if n < MIN_PROMPTS:
        return f"no bound: {n} prompt{'s' * (n != 1)}, {MIN_PROMPTS} needed"
    if spread is not None and limit is not None and spread > limit:
        return f"no bound: output lengths too spread (log-sd {spread:.2f} > {limit:.2f} at {n} prompts)"
    return f"no bound: no spread between the {n} prompts' speedups to bound it by"


def _speedup(sp: dict | None) -> str:
    if not sp or "statistic" not in sp:
        return "–"
    return f"{sp['statistic']:.2f}x ({bound_words(sp)})"


def _p95(per: dict) -> str:
    lo, hi = per.get("p95_ci_low"), per.get("p95_ci_high")
    ci = f"[{_fmt(lo, '.4f', '?')}, {_fmt(hi, '.4f', 'unknown: too few for an upper bound')}]"
    return f"p95 {per['p95']:.4f} s/token {ci} over n={per['n']}"


def statistics_lines(summary: dict) -> str:
    """What the verdicts rest on: the near-tie threshold, latency percentiles with their
    intervals, the speedup beside its per-prompt spread, the exactness test's reach."""
    lines = []
    eps = summary.get("near_tie_epsilon")
    if eps:
        lines.append(f"near-tie epsilon {eps['value']:g} ({eps['source']})")
    from harness.verdict.floor import describe
    lines += [describe(c["floor"]) for c in summary["candidates"].values() if c.get("floor")]
    base = summary.get("baseline_latency")
    if base and "per_token" in base:
        lines.append(f"latency {summary['baseline']}: {_p95(base['per_token'])}")
    for name, cand in summary["candidates"].items():
        if "per_token" in cand.get("latency", {}):
            lines.append(f"latency {name}: {_p95(cand['latency']['per_token'])}")
        sp = cand.get("speedup")
        if sp and sp.get("median_prompt_speedup") is not None:
            lines.append(f"speedup {name}: {sp['statistic']:.2f}x (ratio of totals), one-sided "
                         f"{_fmt(sp.get('lower_bound_level'), '.0%')}: {bound_words(sp)} "
                         f"({sp.get('interval', 'jackknife')} over {sp.get('n_prompts')} prompts, {sp['n']} pairs); "
                         f"per-prompt median "
                         f"{sp['median_prompt_speedup']:.2f}x, {sp['share_prompts_slower']:.0%} of prompts slower")
        pit = ((cand.get("exactness") or {}).get("pit") or {})
        for subset, res in (pit.get("subsets") or {}).items():
            det = res.get("detectable_tv")
            reach = (f"detects a top-two distortion of TV >= {det:.3f} with 80% power" if det is not None else
                     "too few tokens to detect any top-two distortion with 80% power")
            lines.append(f"exactness {name} PIT {subset}: {res.get('n', 0)} tokens, p={_fmt(res.get('pvalue'), '.3g')}"
                         f", {res.get('rejected', 0)} rejected drafts; {reach}")
        if pit.get("reference"):
            lines.append(f"exactness {name} reference: {pit['reference']}")
        for control, what in (("control", "the baseline's own samples"), ("draft_control", "the draft's proposals "
                                                                          "under the replayed q")):
            res = pit.get(control)
            if res:
                lines.append(f"exactness {name} {control.replace('_', ' ')}: {what}, {res.get('n', 0)} tokens, "
                             f"p={_fmt(res.get('pvalue'), '.3g')}, {res.get('impossible', 0)} of probability 0")
        lines += sampled_engine_lines(name, cand)
    return "\n\n" + "\n".join(lines) if lines else ""


def sampled_engine_lines(name: str, cand: dict) -> list[str]:
    """An exact engine candidate on sampled traffic: what the PIT test covered, the noise between
    the engine and the reference, the seed check, and acceptance per temperature."""
    ex = cand.get("exactness") or {}
    if not ex.get("engine"):
        return []
    if ex.get("error"):
        return [f"exactness {name}: not tested: {ex['error']}"]
    pit, lines = ex.get("pit") or {}, []
    mine = (pit.get("subsets") or {}).get("all") or {}
    lines.append(f"exactness {name} coverage: {mine.get('n', 0)} of {mine.get('tokens', 0)} sampled tokens tested "
                 f"({mine.get('left_out', 0)} left out: nucleus undecided by the reference); control "
                 f"{(pit.get('control') or {}).get('n', 0)} of {(pit.get('control') or {}).get('tokens', 0)}")
    noise = pit.get("noise") or {}
    if noise.get("max") is not None:
        lines.append(f"exactness {name} engine-vs-reference margin noise: max {noise['max']:.3g}, median "
                     f"{noise['median']:.3g} logits over {noise['positions']} positions")
    ident = ex.get("identical_to_baseline") or {}
    if ident.get("records"):
        lines.append(f"exactness {name}: token-identical to the baseline at the same seed on {ident['identical']} of "
                     f"{ident['records']} sampled records")
    seeds = ex.get("seeds") or {}
    if seeds.get("pairs"):
        lines.append(f"exactness {name} seeds: {seeds['identical']} of {seeds['pairs']} different-seed pairs identical"
                     + (f"; same seed (A/A): {seeds['same_seed_identical']} of {seeds['same_seed_pairs']} identical"
                        if seeds.get("same_seed_pairs") else ""))
    for t, acc in (cand.get("acceptance_by_temperature") or {}).items():
        a = acc.get("all") or {}
        if a.get("alpha") is not None:
            lines.append(f"acceptance {name} T={t}: α={a['alpha']:.3f} [{_fmt(a.get('alpha_ci_low'), '.3f', '?')}, "
                         f"{_fmt(a.get('alpha_ci_high'), '.3f', '?')}], τ={_fmt(a.get('tau'), '.2f', '?')}, "
                         f"{a.get('proposed', 0)} drafted")
    return lines


def engine_lines(summary: dict) -> str:
    """What was compared, exactly: each engine's version and launch command."""
    lines = []
    for name, info in (summary.get("engines") or {}).items():
        how = " ".join(info["launch"]) if info.get("launch") else info.get("base_url", "?")
        lines.append(f"engine {name}: {info.get('engine', '')} {info.get('version', 'version unknown')} · "
                     f"serves {', '.join(map(str, info.get('models') or [])) or '?'} · {how}".replace("  ", " "))
    unverified = [n for n, c in summary["candidates"].items() if c.get("decoder") == "sglang"]
    if unverified:
        # No SGLang runs where decodegate is tested (CUDA-only wheels, docs/vllm.md): its parser
        # has met documented payloads, never a real server's.
        lines.append(f"SGLang, parser checked on documented payloads only (not the verified path llama.cpp and "
                     f"vLLM are): {', '.join(unverified)}")
    text_only = [n for n, c in summary["candidates"].items() if c.get("compare_on") == "text"]
    if text_only:
        lines.append(f"compared on text (the engine returned no token ids, so no near-tie forensics): "
                     f"{', '.join(text_only)}")
    return "\n\n" + "\n".join(lines) if lines else ""



def drift_lines(summary: dict) -> str:
    """Acceptance against each candidate's reference: per group, then per draft position."""
    def pct(x):
        return "–" if x is None else f"{x:+.1%}"

    def num(x):
        return "–" if x is None else f"{x:.3f}"
    lines = []
    for name, cand in summary["candidates"].items():
        d = cand.get("acceptance_drift")
        if not d or d.get("error"):
            continue
        lines.append(f"acceptance of {name} vs {d['reference']} (tolerance -{d['tolerance']:.0%}, "
                     f"{d['n_paired']} paired records):")
        for c in [*d["comparisons"], *d["by_position"]]:
            flag = "REGRESSED" if c["regressed"] else ("" if c["gated"] else "(not gated)")
            lines.append(f"  {c['group']:<24} {c['quantity']:<8} {num(c['reference'])} -> {num(c['candidate'])}  "
                         f"{pct(c['relative_change'])} [{pct(c['ci_low'])}, {pct(c['ci_high'])}]  "
                         f"{c['rounds_candidate']} rounds  {flag}".rstrip())
    return "\n\n" + "\n".join(lines) if lines else ""


def per_prompt_csv(records: list[dict], path: Path) -> None:
    cols = ["candidate", "decoder", "suite", "item_id", "seed", "temperature", "score", "passed", "n_tokens",
            "wall_s", "ttft_s", "accepted", "proposed", "fallbacks", "finish_reason", "error"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in records:
            st, tm = r.get("stats", {}), r.get("timing", {})
            w.writerow([r["candidate"], r["decoder"], r["suite"], r["item_id"], r["seed"], r["temperature"],
                        r.get("score"), r.get("passed"), len(r.get("tokens", [])), tm.get("wall_s"), tm.get("ttft_s"),
                        st.get("accepted"), st.get("proposed"), st.get("fallbacks"), r.get("finish_reason"),
                        r.get("error", "")])


def _per_token(rows: list[dict]) -> list[float]:
    """Seconds per token of the rows with a measured wall time. A row without one (null: the
    analysis already fails it as a gate) must not end the run before its report and CI files."""
    import math
    walls = [((r.get("timing") or {}).get("wall_s"), len(r["tokens"])) for r in rows]
    return [w / n for w, n in walls if isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)]


def _ns(d: dict):
    """A summary dict with attribute access, as the figure functions read analysis results."""
    from types import SimpleNamespace
    return SimpleNamespace(**d)


def figures(summary: dict, records: list[dict], run_dir: Path) -> list[Path]:
    """Figures per candidate; a figure that cannot be drawn is skipped, never fatal."""
    import analysis
    from analysis import figures as fig
    written = []
    by_cand = analysis.split_by_candidate(records)
    base = [r for r in by_cand.get(summary["baseline"], []) if r.get("tokens")]
    for name, cand in summary["candidates"].items():
        folder = run_dir / "figures" / name
        folder.mkdir(parents=True, exist_ok=True)
        rows = [r for r in by_cand.get(name, []) if r.get("tokens")]
        per_token = {n: _per_token(rs) for n, rs in ((summary["baseline"], base), (name, rows))}
        jobs = [("latency_cdf.png", lambda p, s=per_token: fig.latency_cdfs(s, p, xlabel="seconds per token",
                                                                           title=f"{name}: latency per token"))]
        if not any(per_token.values()):
            jobs = []  # no timed generation on either side (every one failed, or none ran)
        if cand["decoder"] == "speculative" and isinstance(cand.get("acceptance"), dict):
            jobs += [("acceptance_histogram.png", lambda p, a=cand["acceptance"]: fig.acceptance_histogram(_ns(a), p)),
                     ("acceptance_by_position.png", lambda p, a=cand["acceptance"]: fig.acceptance_by_position(_ns(a), p))]
        if cand["decoder"] == "early-exit" and isinstance(cand.get("exits"), dict):
            jobs.append(("exit_layers.png", lambda p, e=cand["exits"]: fig.exit_layer_histogram(_ns(e), p)))
        deltas = {s: (v["quality"]["statistic"], v["quality"]["ci_low"], v["quality"]["ci_high"])
                  for s, v in cand["suites"].items() if "quality" in v}
        if deltas:
            jobs.append(("quality_forest.png", lambda p, d=deltas: fig.forest_plot(d, p)))
        for fname, job in jobs:
            try:
                written.append(job(folder / fname))
            except Exception as e:  # noqa: BLE001 - a figure is never worth losing the run
                (folder / (fname + ".error.txt")).write_text(f"{type(e).__name__}: {e}\n")
    return written


def sweep_lines(summary: dict) -> str:
    """The concurrency sweep: per candidate and level, throughput, latency, speedup, α/τ, and the
    candidate's divergence rate beside the engine's own A/A floor."""
    rows = summary.get("sweep") or []
    if not rows:
        return ""
    f = lambda x, spec: "–" if x is None else format(x, spec)  # noqa: E731
    table = [("candidate", "conc.", "tok/s (base)", "p50 / p95 s", "ttft p50", "speedup [95% CI]", "α / τ",
              "diverged / A/A floor", "A/A noise")]
    for r in rows:
        lo, hi = r["speedup_ci"]
        table.append((r["candidate"], str(r["level"]),
                      f"{f(r['throughput_tok_s'], '.1f')} ({f(r['baseline_throughput_tok_s'], '.1f')})",
                      f"{f(r['latency_p50_s'], '.2f')} / {f(r['latency_p95_s'], '.2f')}", f(r["ttft_p50_s"], ".3f"),
                      f"{f(r['speedup'], '.2f')}x [{f(lo, '.2f')}, {f(hi, '.2f')}]",
                      f"{f(r['alpha'], '.2f')} / {f(r['tau'], '.2f')}",
                      f"{f(r['divergence_rate'], '.3f')} / {f(r['aa_floor_rate'], '.3f')}",
                      f(r.get("aa_noise"), ".3g") + ("" if r.get("aa_floor_valid") is not False else " INVALID")))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n\nconcurrency sweep (each level paired with the baseline at the same level):\n" + "\n".join(lines)


# ------------------------------------------------------------------ CI: Markdown summary, JUnit XML

def markdown(summary: dict, report_text: str | None = None) -> str:
    """The verdict table and every gate in Markdown: a CI job summary ($GITHUB_STEP_SUMMARY) and
    the MLflow parent run's description. `report_text`: the terminal report, appended verbatim."""
    lines = [f"## decodegate regress: {md_code(summary['verdict'].upper())}", "",
             f"target `{md_code(summary.get('target'))}` · profile `{md_code(summary.get('profile'))}` · baseline "
             f"`{md_code(summary.get('baseline'))}` · run `{md_code(str(summary.get('run_uid', ''))[:12])}` · code "
             f"`{md_code(summary.get('code_version', '?'))}`", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in verdict_rows(summary)]
    gates = [(n, g) for n, c in summary["candidates"].items() for g in c.get("gates") or []]
    if gates:
        lines += ["", "### Gates", "", "| candidate | gate | status | detail |", "|---|---|---|---|"]
        lines += [f"| {md_cell(n)} | {md_cell(g['name'])} | **{md_cell(g['status'].upper())}** | {md_cell(g['detail'])} |"
                  for n, g in gates]
    if (why := (summary.get("timing") or {}).get("why")):
        lines += ["", f"**{md_cell(why)}**"]
    if report_text:
        lines += ["", "### Report", "", *md_fence(report_text.rstrip())]
    return "\n".join(lines) + "\n"


def junit_xml(summary: dict) -> str:
    """JUnit XML: one testsuite per candidate, one testcase per gate; a failed gate is a <failure>
    carrying the gate's detail, a warning is reported in the testcase's output (it does not fail)."""
    import xml.etree.ElementTree as ET
    root = ET.Element("testsuites", name="decodegate regress")
    total = failed = 0
    for name, cand in summary["candidates"].items():
        if cand.get("role") == "aa-floor":
            continue  # the baseline run again measures the floor; it is not on trial
        gates = list(cand.get("gates") or [])
        if not gates and cand.get("verdict") != "pass":  # fail closed: a verdict with no gate behind it
            gates = [{"name": "verdict", "status": "fail", "detail": "no gate results for this candidate"}]
        fails = sum(g["status"] == "fail" for g in gates)
        suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(gates)), failures=str(fails),
                              errors="0", skipped="0", timestamp=str(summary.get("created", "")))
        props = ET.SubElement(suite, "properties")
        for k in ("decoder", "kind", "target", "verdict"):
            ET.SubElement(props, "property", name=k, value=str(cand.get(k, "")))
        for g in gates:
            case = ET.SubElement(suite, "testcase", classname=f"decodegate.{name}", name=g["name"], time="0")
            if g["status"] == "fail":
                failure = ET.SubElement(case, "failure", message=g["detail"].splitlines()[0][:500] if g["detail"]
                                        else "failed", type="gate")
                failure.text = g["detail"]
            out = ET.SubElement(case, "system-out")
            out.text = f"{g['status'].upper()}: {g['detail']}"
        total += len(gates)
        failed += fails
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("errors", "0")
    for el in root.iter():   # engine error bodies and names can hold characters XML forbids
        el.text = None if el.text is None else xml_text(el.text)
        el.attrib = {k: xml_text(v) for k, v in el.attrib.items()}
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_ci(summary: dict, report_text: str, junit_path: str | None = None, summary_md: str | None = None,
             environ: dict | None = None) -> None:
    """`--junit-xml` and `--summary-md` files; the Markdown is also appended to $GITHUB_STEP_SUMMARY
    when that is set (appended, never overwritten: earlier steps wrote there too)."""
    import os
    environ = os.environ if environ is None else environ
    if junit_path:
        Path(junit_path).write_text(junit_xml(summary))
    if summary_md:
        md = markdown(summary, report_text)
        step = environ.get("GITHUB_STEP_SUMMARY")
        if not (step and Path(step).resolve() == Path(summary_md).resolve()):
            Path(summary_md).write_text(md)
        if step:
            with open(step, "a") as f:
                f.write(md)


def check_ci_paths(*paths: str | None) -> None:
    """Before a run: an output file that cannot be written fails now, not after an hour (and not
    after the verdict, where it would cost the printed report and the MLflow upload)."""
    import os
    from harness.config import ConfigError
    for p in paths:
        if not p:
            continue
        path = Path(p).resolve()
        if not path.parent.is_dir():
            raise ConfigError(f"cannot write {p}: folder {path.parent} does not exist")
        if path.is_dir():
            raise ConfigError(f"cannot write {p}: it is a folder")
        if not os.access(path if path.exists() else path.parent, os.W_OK):
            raise ConfigError(f"cannot write {p}: permission denied")


NOT_FINISHED = "the run did not finish: no verdict (see the log of the regress step)"


def placeholder_ci(junit_path: str | None = None, summary_md: str | None = None, environ: dict | None = None) -> None:
    """Before a run, replace the previous run's CI files with a failure: a run that stops before
    its verdict (a crash, an engine down, bad input found late) must not leave the last run's
    green files for CI's reporters to show. The step summary is appended to, so it gets nothing."""
    import os
    environ = os.environ if environ is None else environ
    if junit_path:
        Path(junit_path).write_text(
            '<?xml version="1.0" encoding="utf-8"?>\n<testsuites name="decodegate regress" tests="1" failures="0" '
            'errors="1">\n  <testsuite name="decodegate" tests="1" failures="0" errors="1" skipped="0">\n'
            f'    <testcase classname="decodegate" name="run" time="0">\n      <error message="{NOT_FINISHED}" '
            'type="no-verdict" />\n    </testcase>\n  </testsuite>\n</testsuites>\n')
    step = environ.get("GITHUB_STEP_SUMMARY")
    if summary_md and not (step and Path(step).resolve() == Path(summary_md).resolve()):
        Path(summary_md).write_text(f"## decodegate regress: NO VERDICT\n\n{NOT_FINISHED}\n")
