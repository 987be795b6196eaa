"""Bad input on the command line ends in one line naming what is wrong and exit 2, never a
traceback with exit 3, and keeps what a run already wrote: a run folder that is a file, an
unknown device, a candidate option no decoder takes (found after the folder was made, which must
not then refuse the corrected config), a corrupt records file, a summary.json that is not one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.config import ConfigError, load_config

OPTIONS = '{ draft = "prompt-lookup", k = 3 }'


def _setup(tmp_path: Path, options: str = OPTIONS, top: str = "") -> Path:
    rows = [{"suite": "s", "version": "1", "description": "bad-input tests", "smoke": ["a", "b"],
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}},
            {"id": "a", "prompt": "Tell me about cats", "references": ["\u0000never"]},
            {"id": "b", "prompt": "Tell me about rivers", "references": ["\u0000never"]}]
    suite = tmp_path / "s.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / f"regress-{len(list(tmp_path.glob('regress-*.toml')))}.toml"
    cfg.write_text(f"""target = "tiny-llama"
{top}
[baseline]
name = "baseline"
decoder = "standard"
[[candidates]]
name = "spec"
decoder = "speculative"
options = {options}
[suites.s]
margin = 0.5
path = "{suite}"
[profiles.smoke]
subset = "smoke"
suites = ["s"]
temperatures = [0.0]
seeds = [0]
""")
    return cfg


def regress(cfg: Path, run_dir: Path) -> int:
    return main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", "--no-tracking"])


def _one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err[-1500:]
    for n in needles:
        assert n in err, (n, err[-800:])


def test_a_run_folder_that_is_a_file_is_refused(tmp_path, capsys):
    cfg = _setup(tmp_path)
    (tmp_path / "afile").write_text("")
    assert regress(cfg, tmp_path / "afile") == 2  # before: FileExistsError, exit 3
    _one_line_error(capsys, "afile is a file, not a folder")
    assert regress(cfg, tmp_path / "afile" / "sub") == 2  # before: NotADirectoryError, exit 3
    _one_line_error(capsys, "cannot create the run folder", "Not a directory")


def test_an_unknown_device_is_refused_in_the_config_and_on_the_command_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="device must be"):
        load_config(_setup(tmp_path, top='device = "tpu"'), "smoke")
    assert load_config(_setup(tmp_path, top='device = "cuda:1"'), "smoke").device == "cuda:1"
    assert main(["generate", "--target", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "2",
                 "--device", "tpu"]) == 2  # before: RuntimeError from torch.device, exit 3
    _one_line_error(capsys, "unknown device 'tpu'")


def test_a_bad_candidate_option_names_the_candidate_and_does_not_block_the_fix(tmp_path, capsys):
    bad = _setup(tmp_path, options='{ draft = "prompt-lookup", kk = 3 }')
    run_dir = tmp_path / "run"
    assert regress(bad, run_dir) == 2
    _one_line_error(capsys, f"{bad}: 'spec' (decoder 'speculative')", "takes no option(s) kk")
    # The corrected config in the same folder: it was refused as "made from another config".
    assert regress(_setup(tmp_path), run_dir) == 0
    assert json.loads((run_dir / "summary.json").read_text())["candidates"]["spec"]["verdict"] == "pass"


def test_ci_files_of_a_run_that_stops_before_its_verdict_are_not_the_last_runs(tmp_path, capsys):
    """A JUnit file or job summary left from the previous (green) run would be shown by CI's
    reporters for a run that stopped; a --junit-xml that is a folder killed the run after its
    verdict, costing the printed report and the upload."""
    import xml.etree.ElementTree as ET
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    junit.write_text('<testsuites tests="3" failures="0"><testsuite name="spec"/></testsuites>')
    md.write_text("## decodegate regress: PASS\n")
    bad = _setup(tmp_path, options='{ draft = "prompt-lookup", kk = 3 }')   # found after the models load
    assert main(["regress", "--config", str(bad), "--run-dir", str(tmp_path / "r"), "--no-progress",
                 "--no-tracking", "--junit-xml", str(junit), "--summary-md", str(md)]) == 2
    _one_line_error(capsys, "kk")
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "1" and root.find("testsuite/testcase/error") is not None
    assert "NO VERDICT" in md.read_text() and "PASS" not in md.read_text()
    (tmp_path / "folder.xml").mkdir()
    assert main(["regress", "--config", str(bad), "--no-tracking", "--plan-only",
                 "--junit-xml", str(tmp_path / "folder.xml")]) == 2
    _one_line_error(capsys, "is a folder")


def test_a_tracking_server_that_is_down_before_the_run_is_one_line(tmp_path, capsys):
    cfg = _setup(tmp_path)
    cfg.write_text(cfg.read_text().replace('options = {', 'acceptance_reference = "mlflow:last"\noptions = {'))
    assert main(["regress", "--config", str(cfg), "--run-dir", str(tmp_path / "r"), "--no-progress",
                 "--tracking-uri", "http://127.0.0.1:9"]) == 2
    _one_line_error(capsys, "not reachable")


def test_a_corrupt_run_folder_is_named_not_a_crash(tmp_path, capsys):
    cfg = _setup(tmp_path)
    run_dir = tmp_path / "run"
    assert regress(cfg, run_dir) == 0
    records = run_dir / "records.jsonl"
    lines = records.read_text().splitlines()
    lines[1] = '{"oops'
    records.write_text("\n".join(lines) + "\n")
    assert regress(cfg, run_dir) == 2  # before: ValueError from the records reader, exit 3
    _one_line_error(capsys, "records.jsonl: line 2 is not valid JSON")
    assert records.read_text().splitlines() == lines  # nothing was rewritten
    assert main(["sync", str(run_dir), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"]) == 2
    _one_line_error(capsys, "line 2 is not valid JSON")
    for body, needle in (("{broken", "is not valid JSON"), ("{}", "not a decodegate run summary (no run_uid")):
        fake = tmp_path / f"fake{len(body)}"
        fake.mkdir()
        (fake / "summary.json").write_text(body)
        assert main(["sync", str(fake), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"]) == 2
        _one_line_error(capsys, needle)  # before: JSONDecodeError / KeyError, exit 3
        assert main(["estimate-acceptance", "--target", "tiny-llama", "--draft", "prompt-lookup", "--suite",
                     str(tmp_path / "s.jsonl"), "--baseline-run", str(fake)]) == 2
        _one_line_error(capsys, needle)
