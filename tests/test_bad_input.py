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
from helpers import regress, spec_candidate, write_regress_config

OPTIONS = '{ draft = "prompt-lookup", k = 3 }'


def _setup(tmp_path: Path, options: str = OPTIONS, top: str = "") -> Path:
    rows = [{"suite": "s", "version": "1", "description": "bad-input tests", "smoke": ["a", "b"],
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}},
            {"id": "a", "prompt": "Tell me about cats", "references": ["\u0000never"]},
            {"id": "b", "prompt": "Tell me about rivers", "references": ["\u0000never"]}]
    suite = tmp_path / "s.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / f"regress-{len(list(tmp_path.glob('regress-*.toml')))}.toml"
    write_regress_config(cfg, head=top, candidates=spec_candidate(options),
                         suites={"s": {"margin": 0.5, "path": str(suite)}},
                         profile={"subset": "smoke", "suites": ["s"], "temperatures": [0.0], "seeds": [0]})
    return cfg


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


def test_a_sqlite_store_that_cannot_be_one_costs_regress_seconds_not_its_results(tmp_path, capsys):
    """A tracking URI naming a folder: MLflow retried it for about two minutes and then failed
    with a database traceback; the run now warns in seconds, keeps its folder and its verdict."""
    import time
    cfg = _setup(tmp_path)
    (tmp_path / "store").mkdir()
    t0 = time.monotonic()
    assert main(["regress", "--config", str(cfg), "--run-dir", str(tmp_path / "r"), "--no-progress",
                 "--tracking-uri", f"sqlite:///{tmp_path / 'store'}"]) == 0
    assert time.monotonic() - t0 < 60
    _one_line_error(capsys, "is a folder, not an SQLite file", "decodegate sync")
    assert (tmp_path / "r" / "summary.json").exists() and not list((tmp_path / "store").iterdir())


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


SMOKE = '[profiles.smoke]\nsubset = "smoke"\nsuites = ["s"]\ntemperatures = [0.0]\nseeds = [0]\n'
ENGINE = '\n[engines.e]\nbase_url = "http://127.0.0.1:9"\n'


@pytest.mark.parametrize("old, new, needle", [
    # a value of the wrong shape where a table goes (before: AttributeError or TypeError, exit 3)
    ('target = "tiny-llama"\n', 'target = "tiny-llama"\ngates = 1\n', "gates must be a table"),
    ('target = "tiny-llama"\n', 'target = "tiny-llama"\nlabels = "team"\n', "labels must be a table"),
    ('target = "tiny-llama"\n', 'target = "tiny-llama"\nengines = []\n', "engines must be a table"),
    ("[suites.s]\nmargin = 0.5\n", "[suites]\ns = 1\n[suites.u]\nmargin = 0.5\n", "[suites.s]: must be a table"),
    (SMOKE, "[profiles]\nsmoke = 3\n", "[profiles.smoke]: must be a table"),
    (SMOKE, SMOKE + ENGINE + 'env = "A=1"\n', "env must be a table"),
    # a value of the wrong type inside a list or for a key (before: ValueError from float()/int(), exit 3)
    ('suites = ["s"]', 'suites = ["s", 5]', "suites must be a list of names"),
    ("temperatures = [0.0]", 'temperatures = ["hot"]', "temperatures must be numbers"),
    ("seeds = [0]\n", 'seeds = [0]\nexactness_prompts = "x"\n', "exactness_prompts must be an integer >= 0"),
    # accepted before, and run (plan-only: exit 0) or met only when the model loads (target = 5: exit 3)
    ('target = "tiny-llama"', "target = 5", "target must be a model name"),
    ('target = "tiny-llama"\n', 'target = "tiny-llama"\nchat = "false"\n', "'chat' must be true or false"),
    ('target = "tiny-llama"\n', 'target = "tiny-llama"\ntop_p = true\n', "top_p must be in (0, 1]"),
    ('suites = ["s"]', "suites = []", "suites is empty"),
    ('suites = ["s"]', 'suites = ["s", "s"]', "suites names s more than once"),
    ("temperatures = [0.0]", "temperatures = [0.0, inf]", "temperature must be finite, got inf"),
    ("seeds = [0]\n", "seeds = [0]\nexactness_prompts = -3\n", "exactness_prompts must be an integer >= 0"),
    ("seeds = [0]\n", "seeds = [0]\nexactness_samples = 0\n", "exactness_samples must be an integer >= 1"),
    ("seeds = [0]\n", "seeds = [0]\nexactness_samples = 2.5\n", "exactness_samples must be an integer >= 1"),
    ("seeds = [0]\n", "seeds = [0]\nmax_new_tokens = true\n", "max_new_tokens must be a positive integer"),
    (SMOKE, SMOKE + ENGINE.replace('"http://127.0.0.1:9"', "5"), "'base_url' must be a string"),
    ("seeds = [0]\n", "seeds = [0]\ntop_k = 0\n", "top_k must be an integer >= 1"),
    ("seeds = [0]\n", "seeds = [0]\ntop_k = 2.5\n", "top_k must be an integer >= 1"),
    ("seeds = [0]\n", "seeds = [0]\ntop_k = true\n", "top_k must be an integer >= 1"),
])
def test_a_config_value_of_the_wrong_shape_or_type_is_named(tmp_path, capsys, old, new, needle):
    cfg = _setup(tmp_path)
    text = cfg.read_text()
    assert old in text
    cfg.write_text(text.replace(old, new, 1))
    assert main(["regress", "--config", str(cfg), "--plan-only", "--no-tracking"]) == 2
    _one_line_error(capsys, needle)


def test_a_model_folder_without_a_config_is_named(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    assert main(["generate", "--target", str(tmp_path / "model"), "--prompt", "hi"]) == 2
    # before: transformers' first line only, "Couldn't instantiate the backend tokenizer from one of:"
    _one_line_error(capsys, "has no config.json")
    (tmp_path / "model" / "config.json").write_text("{}")
    assert main(["generate", "--target", str(tmp_path / "model"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not err.rstrip().endswith(":"), err  # the message is whole, not cut


def test_a_config_that_is_a_folder_or_not_utf8_is_named(tmp_path, capsys):
    args = ["--plan-only", "--no-tracking"]
    assert main(["regress", "--config", str(tmp_path), *args]) == 2
    _one_line_error(capsys, "is a folder")  # before: "config file not found" for a folder that exists
    cfg = _setup(tmp_path)
    cfg.write_bytes(cfg.read_bytes().replace(b'name = "spec"', b'name = "sp\xe9c"'))  # a latin-1 editor
    assert main(["regress", "--config", str(cfg), *args]) == 2  # before: UnicodeDecodeError, exit 3
    _one_line_error(capsys, "not UTF-8 (byte 0xe9 on line")


@pytest.mark.parametrize("body", ["{oops", "{}", "[1]"])
def test_a_run_folder_whose_run_json_is_broken_is_named_and_kept(tmp_path, capsys, body):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(body)
    assert regress(_setup(tmp_path), run_dir) == 2  # before: JSONDecodeError / KeyError / TypeError, exit 3
    _one_line_error(capsys, f"{run_dir / 'run.json'} is not a decodegate run record", "use a new --run-dir")
    assert [p.name for p in run_dir.iterdir()] == ["run.json"] and (run_dir / "run.json").read_text() == body


def test_every_subcommand_help_states_its_exit_codes(capsys):
    from harness.cli import COMMANDS
    for argv in [[name] for name in COMMANDS if name != "lm-eval"] + [["suites", s] for s in ("list", "show", "import")]:
        with pytest.raises(SystemExit) as e:
            main([*argv, "--help"])
        assert e.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        # before: only the top-level --help said them; `generate --help` and most others did not
        assert "2 a usage or input error" in out and "3 an internal error" in out, argv
        assert ("1 a gate failed" in out) == (argv == ["regress"]), argv


@pytest.mark.parametrize("setting", ['limit = "x"', "limit = -2", "limit = 1.5", "max_gen_toks = 0"])
def test_an_lmeval_suite_limit_or_budget_is_checked_before_the_run(tmp_path, capsys, setting):
    """lm-eval suites run after every other suite: a bad value was met there, not on load."""
    cfg = _setup(tmp_path)
    local = Path(__file__).parent / "data" / "lmeval"
    text = cfg.read_text().replace('suites = ["s"]', 'suites = ["s", "lmeval:decodegate_tiny_gen"]')
    cfg.write_text(text + f'\n[suites."lmeval:decodegate_tiny_gen"]\ninclude_path = "{local}"\n{setting}\n')
    assert main(["regress", "--config", str(cfg), "--plan-only", "--no-tracking"]) == 2  # before: exit 0
    _one_line_error(capsys, f"{setting.split()[0]} must be an integer >= 1")


def test_a_misspelt_decoder_option_is_named_with_the_closest_before_models_load(tmp_path, capsys):
    cfg = _setup(tmp_path, options='{ draft = "prompt-lookup", kk = 3 }')
    assert main(["regress", "--config", str(cfg), "--plan-only", "--no-tracking"]) == 2  # before: exit 0
    _one_line_error(capsys, "'spec' (decoder 'speculative'): takes no option(s) kk (did you mean 'k'?)")
    cfg.write_text(cfg.read_text().replace("[baseline]\n", "[baseline]\noptions = { treshold = 0.9 }\n", 1)
                   .replace('decoder = "standard"', 'decoder = "early-exit"', 1))
    assert main(["regress", "--config", str(cfg), "--plan-only", "--no-tracking"]) == 2
    _one_line_error(capsys, "takes no option(s) treshold (did you mean 'threshold'?)")
    # A value only the built decoder can judge is still found after the run folder is made, and the
    # folder still takes the corrected config.
    run_dir = tmp_path / "run"
    assert regress(_setup(tmp_path, options='{ draft = "prompt-lookup", k = 0 }'), run_dir) == 2
    _one_line_error(capsys, "k must be an integer >= 1, got 0")
    assert regress(_setup(tmp_path), run_dir) == 0


@pytest.mark.parametrize("argv, needle", [
    (["--temperature", "inf"], "temperature must be finite, got inf"),
    (["--stop", ""], "--stop must not be empty"),
])
def test_generate_refuses_an_infinite_temperature_and_an_empty_stop_string(capsys, argv, needle):
    """T = inf samples uniformly, testing nothing of the model; "" is found in every text. Both
    generated before (exit 0), unlike the same values in a config or a suite file."""
    assert main(["generate", "--target", "tiny-llama", "--prompt", "Tell me about cats", "--max-new-tokens", "3",
                 *argv]) == 2
    _one_line_error(capsys, needle)


def test_a_profile_top_k_reaches_every_sampled_request_and_no_greedy_one(tmp_path, tiny_llama):
    """`top_k` in a profile is the top-k cut of its sampled requests (every decoder's
    GenerationRequest; engines pass it on); greedy requests carry none."""
    from harness.run.work import make_request, work_items
    from suites import load_suite
    cfg = _setup(tmp_path)
    cfg.write_text(cfg.read_text().replace("temperatures = [0.0]", "temperatures = [0.0, 0.7]")
                   .replace("seeds = [0]\n", "seeds = [0, 1]\ntop_k = 20\n", 1))
    config = load_config(cfg, "smoke")
    assert config.profile.top_k == 20
    suite = load_suite(config.suites["s"].path)
    reqs = [(w.temperature, make_request(config, tiny_llama, w).top_k) for w in work_items(config, [suite])]
    assert sorted(set(reqs)) == [(0.0, 0), (0.7, 20)], reqs


def test_a_negative_zero_temperature_is_greedy_and_keyed_as_greedy(tmp_path):
    """`temperatures = [-0.0]` is greedy (t == 0), but was kept as -0.0 and keyed "T=-0" in the
    summary, where the greedy identity gate (which reads "T=0") never looked: a broken candidate
    passed. The config, and an as-logged item's own temperature, give +0.0."""
    import math
    from types import SimpleNamespace
    from harness.run.work import logged
    cfg = _setup(tmp_path)
    cfg.write_text(cfg.read_text().replace("temperatures = [0.0]", "temperatures = [-0.0, 0.7]")
                   .replace("seeds = [0]\n", "seeds = [0, 1]\n", 1))
    logged_t = logged(SimpleNamespace(sampling={"temperature": -0.0}), "temperature")[0]
    for t in (load_config(cfg, "smoke").profile.temperatures[0], logged_t):
        assert t == 0 and math.copysign(1, t) == 1 and f"T={t:g}" == "T=0", t


def test_a_records_file_with_negative_zero_temperatures_is_read_as_greedy(tmp_path):
    """A run folder written before the config made -0.0 greedy (a resumed run, or any records
    file) kept its -0.0 rows: keyed "T=-0", their greedy block escaped the identity gate."""
    import json
    import math

    from harness.run.records import read_records
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps({"candidate": "c", "temperature": t})
                                                      for t in (-0.0, 0.7)) + "\n")
    rows = read_records(tmp_path)
    assert math.copysign(1, rows[0]["temperature"]) == 1 and f"T={rows[0]['temperature']:g}" == "T=0"
    assert rows[1]["temperature"] == 0.7
