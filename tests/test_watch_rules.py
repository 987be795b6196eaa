"""The exported Prometheus rules, proven by Prometheus itself: `promtool test rules` unit tests
for each engine's rule file, whose input series are the engines' real scrapes (the captures under
tests/data/vllm and tests/data/llamacpp: their series names, labels and per-request counter
increments), each alert shown firing where it should and silent where it should not:

- acceptance at the reference: nothing fires; acceptance at a quarter of the boundary:
  SpecDecodeAcceptanceBelowReference;
- the server relaunched without speculation (its own capture: vLLM exports no spec-decode
  series at all, llama.cpp keeps them at 0), and, for vLLM, drafting that stands still while
  generating (the capture of a request its n-gram drafter found nothing for; llama.cpp's drafted
  8 tokens there): SpecDecodeStoppedDrafting;
- `watch`'s decodegate_alarm 0 then 1: SpecDecodeAcceptanceAlarm from when it turns 1;
- the engine's series gone (only watch's alarm scraped): SpecDecodeEngineSeriesAbsent; watch's
  alarm series gone (only the engine's): DecodegateWatchAbsent.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from decoders.engines.telemetry import flatten
from harness.cli import main
from harness.verdict import live_reference
from test_watch_live import write_reference

DATA = Path(__file__).resolve().parent / "data"
ENGINES = {  # capture folder, the engine as a run records it, the decoder
    "vllm": (DATA / "vllm", "vLLM", "vllm"),
    "llamacpp": (DATA / "llamacpp", "llama.cpp", "llama.cpp"),
}
PER_MINUTE = 30          # requests a minute of the captured shape
INSTANCE = {"instance": "engine-a:8000", "job": "spec-engine"}


def scrape(folder: Path, name: str) -> dict[str, float]:
    return flatten((folder / name).read_text())


def counters(metrics: dict[str, float]) -> dict[str, tuple[str, float]]:
    """drafted / accepted / generated: (the captured series with its labels, its value)."""
    from harness.commands.monitoring import engine_series
    out = {}
    for key, value in metrics.items():
        base = key.split("{", 1)[0]
        for what in ("drafted", "accepted", "generated"):
            for prefix in ("vllm", "llamacpp"):
                if base == engine_series(prefix)[what]:
                    out[what] = (key, value)
    return out


def series(key: str, start: float, step: float, minutes: int = 60) -> dict:
    labels = ",".join(f'{k}="{v}"' for k, v in INSTANCE.items())
    name = key[:-1] + "," + labels + "}" if key.endswith("}") else key + "{" + labels + "}"
    return {"series": name.replace("{,", "{"), "values": f"{start:g}+{step:g}x{minutes}"}


def scenario(folder: Path, *, acceptance: float | None = None, nomatch: bool = False, gone: bool = False) -> list:
    """Input series: PER_MINUTE requests a minute shaped as the captured one (drafted, accepted,
    generated increments), the accepted share replaced by `acceptance` where given."""
    before, after = counters(scrape(folder, "ngram-metrics-before.txt")), counters(scrape(folder, "ngram-metrics-after.txt"))
    d = {k: after[k][1] - before[k][1] for k in after}
    if gone:  # the server relaunched without speculation: its own scrape (vLLM: no spec-decode series at all;
        # llama.cpp: the series stay, at 0), generation moving at the same pace
        plain = counters(scrape(folder, "plain-metrics-after.txt" if (folder / "plain-metrics-after.txt").exists()
                                else "plain-metrics.txt"))
        assert "generated" in plain and all(plain[k][1] == 0 for k in plain if k != "generated"), plain
        return [series(key, value, PER_MINUTE * d["generated"] if what == "generated" else 0)
                for what, (key, value) in plain.items()]
    if nomatch:  # requests the drafter finds nothing for: generation moves, drafting stands still
        later = counters(scrape(folder, "ngram-metrics-nomatch.txt"))
        g = later["generated"][1] - after["generated"][1]
        assert later["drafted"][1] == after["drafted"][1] and g > 0
        return [series(after["drafted"][0], after["drafted"][1], 0), series(after["accepted"][0], after["accepted"][1], 0),
                series(after["generated"][0], after["generated"][1], PER_MINUTE * g)]
    accepted = d["accepted"] if acceptance is None else acceptance * d["drafted"]
    return [series(before["drafted"][0], before["drafted"][1], PER_MINUTE * d["drafted"]),
            series(before["accepted"][0], before["accepted"][1], PER_MINUTE * accepted),
            series(before["generated"][0], before["generated"][1], PER_MINUTE * d["generated"])]


def drafts_nothing_on_nomatch(folder: Path) -> bool:
    after, later = (counters(scrape(folder, f"ngram-metrics-{n}.txt")) for n in ("after", "nomatch"))
    return later["drafted"][1] == after["drafted"][1]


def captured_acceptance(folder: Path) -> float:
    before, after = counters(scrape(folder, "ngram-metrics-before.txt")), counters(scrape(folder, "ngram-metrics-after.txt"))
    return (after["accepted"][1] - before["accepted"][1]) / (after["drafted"][1] - before["drafted"][1])


def expect(alert: str, at: str, labels: dict | None, rules: dict | None = None, value: float | None = None) -> dict:
    """An alert_rule_test entry: silent (labels None) or one alert with these labels and the rule's
    own annotations, templates expanded as Prometheus would for them."""
    if labels is None:
        return {"eval_time": at, "alertname": alert, "exp_alerts": []}
    rule = next(r for r in rules["groups"][0]["rules"] if r.get("alert") == alert)
    notes = {}
    for key, text in rule["annotations"].items():
        for name, v in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", v)
        if value is not None:
            text = text.replace('{{ $value | printf "%.3f" }}', f"{value:.3f}")
        assert "{{" not in text, text
        notes[key] = text
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": labels, "exp_annotations": notes}]}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_promtool_test_rules_shows_every_alert_firing_and_silent(engine, tmp_path):
    folder, recorded, decoder = ENGINES[engine]
    if not (folder / "ngram-metrics-after.txt").exists():
        pytest.fail(f"no capture of {engine} under {folder} (scripts/capture_llamacpp_metrics.py makes it)")
    # A reference whose acceptance is the captured one (60 requests of 50 drafted tokens).
    p = captured_acceptance(folder)
    ref_dir = write_reference(tmp_path / "ref", [(round(p * 50), 50, 0.0)] * 30 + [(round(p * 50) + 2, 50, 0.0),
                              (round(p * 50) - 2, 50, 0.0)] * 15, engine=recorded, decoder=decoder)
    promtool_unit_tests(folder, ref_dir, tmp_path / "m")


def promtool_unit_tests(folder: Path, ref_dir: Path, out: Path, candidate: str | None = None) -> None:
    """Export the rules of the reference in `ref_dir` into `out` and prove them with `promtool
    test rules` on input series made from the scrapes in `folder` (ngram-metrics-{before,after,
    nomatch}.txt, plain-metrics[-after].txt); raises AssertionError with promtool's output."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `apt-get install -y prometheus` (make setup does)"
    assert main(["export-monitoring", str(ref_dir), "--out", str(out), *(["--candidate", candidate] if candidate else [])]) == 0
    ref = live_reference.load(str(ref_dir), candidate)
    engine = ref.metric_prefix
    text = (out / "decodegate-rules.yml").read_text()
    rules = yaml.safe_load(text)
    assert ("llamacpp:" in text) == (engine == "llamacpp") and ("vllm:" in text) == (engine == "vllm")
    run_labels = {**ref.labels, "optimization": ref.candidate}
    warn = {"severity": "warning", **run_labels, "instance": INSTANCE["instance"]}
    alarm = [{"series": f'decodegate_alarm{{engine="engine-a:8000",optimization="{ref.candidate}"}}',
              "values": "0x10 1x30"}]
    tests = [
        {"name": "acceptance at the reference: silent", "interval": "1m", "input_series": scenario(folder, acceptance=ref.ratio),
         "alert_rule_test": [expect("SpecDecodeAcceptanceBelowReference", "40m", None),
                             expect("SpecDecodeStoppedDrafting", "40m", None)]},
        {"name": "acceptance at a quarter of the boundary", "interval": "1m",
         "input_series": scenario(folder, acceptance=ref.boundary() / 4),
         "alert_rule_test": [expect("SpecDecodeAcceptanceBelowReference", "5m", None),
                             expect("SpecDecodeAcceptanceBelowReference", "40m", warn, rules, ref.boundary() / 4),
                             expect("SpecDecodeStoppedDrafting", "40m", None)]},
        {"name": "spec-decode series gone (relaunched without speculation)", "interval": "1m",
         "input_series": scenario(folder, gone=True),
         "alert_rule_test": [expect("SpecDecodeStoppedDrafting", "10m", None),
                             expect("SpecDecodeStoppedDrafting", "40m", warn, rules),
                             expect("SpecDecodeAcceptanceBelowReference", "40m", None)]},
        {"name": "watch's alarm", "interval": "1m", "input_series": alarm,
         "alert_rule_test": [expect("SpecDecodeAcceptanceAlarm", "5m", None),
                             expect("SpecDecodeAcceptanceAlarm", "20m",
                                    {"severity": "critical", **run_labels, "engine": "engine-a:8000"}, rules)]},
    ]
    # Series that vanish: the engine down (only watch's alarm left), watch gone (only the engine's series).
    engine_only = scenario(folder, acceptance=ref.ratio)
    tests += [
        {"name": "the engine's series gone", "interval": "1m", "input_series": alarm,
         "alert_rule_test": [expect("SpecDecodeEngineSeriesAbsent", "5m", None),
                             expect("SpecDecodeEngineSeriesAbsent", "20m", {"severity": "warning", **run_labels}, rules),
                             expect("DecodegateWatchAbsent", "20m", None)]},
        {"name": "watch gone", "interval": "1m", "input_series": engine_only,
         "alert_rule_test": [expect("DecodegateWatchAbsent", "5m", None),
                             expect("DecodegateWatchAbsent", "20m", {"severity": "warning", **run_labels}, rules),
                             expect("SpecDecodeEngineSeriesAbsent", "20m", None)]},
    ]
    if drafts_nothing_on_nomatch(folder):  # vLLM's n-gram drafter found nothing for the captured prompt
        tests.append({"name": "drafting stands still while generating", "interval": "1m",
                      "input_series": scenario(folder, nomatch=True),
                      "alert_rule_test": [expect("SpecDecodeStoppedDrafting", "10m", None),
                                          expect("SpecDecodeStoppedDrafting", "40m", warn, rules)]})
    unit = out / "decodegate-rules.test.yml"
    unit.write_text(yaml.safe_dump({"rule_files": ["decodegate-rules.yml"], "evaluation_interval": "1m",
                                    "tests": tests}, sort_keys=False))
    run = subprocess.run([promtool, "test", "rules", str(unit)], capture_output=True, text=True)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
