"""Faults a red-team review found in the commands around `regress`: each is refused with one line
naming the problem (exit 2), before any work it would waste, and never costs results already made.

estimate-acceptance: a --baseline-run of another target or another version of the suite, and a
temperature that is no number (nan, inf). bench: an --out that cannot be written (checked before
the run; a write that fails after it still prints the results). suites import: a BOM, JSON
strings holding U+2028/U+2029/U+0085, max_completion_tokens beside a null max_tokens, `stop`, the
settings a suite cannot replay (warned and recorded), and bad --name/--version/--max-new-tokens
named as flags. sync: a summary whose candidate lacks its verdict. exit-frontier: --margin nan."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from helpers import spec_candidate, write_regress_config
from suites import load_suite


def _suite(path: Path, prompt_a: str = "Tell me about cats") -> Path:
    rows = [{"suite": "s", "version": "1", "description": "command faults", "smoke": ["a", "b"],
             "defaults": {"grader": "none", "max_new_tokens": 6, "stop": []}},
            {"id": "a", "prompt": prompt_a}, {"id": "b", "prompt": "Tell me about rivers"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def regress_run(tmp_path_factory) -> Path:
    """A finished regress run on tiny-llama over suite `s` (the folder is copied by the tests that edit it)."""
    tmp = tmp_path_factory.mktemp("faults")
    suite = _suite(tmp / "s.jsonl")
    cfg = write_regress_config(tmp / "regress.toml", candidates=spec_candidate(), suites={"s": {"path": str(suite)}},
                               profile={"subset": "smoke", "suites": ["s"], "temperatures": [0.0], "seeds": [0]})
    run_dir = tmp / "run"
    rc = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", "--no-tracking"])
    assert rc in (0, 1) and (run_dir / "summary.json").exists()
    return run_dir


def _err(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err[-1500:]
    for n in needles:
        assert n in err, (n, err[-800:])
    return err


# ------------------------------------------------------------------------------ estimate-acceptance

def test_estimate_refuses_a_baseline_run_of_another_target_or_suite(regress_run, tmp_path, capsys):
    suite = _suite(tmp_path / "s.jsonl")
    args = ["estimate-acceptance", "--draft", "prompt-lookup", "--baseline-run", str(regress_run), "--json"]
    assert main([*args, "--target", "tiny-llama", "--suite", str(suite)]) == 0  # the run's own target and suite
    capsys.readouterr()
    # Another model: its token ids teacher-forced through tiny-llama's outputs (before: exit 0 or 3).
    assert main([*args, "--target", "tiny-qwen2", "--suite", str(suite)]) == 2
    _err(capsys, "its baseline ran on target 'tiny-llama'", "'tiny-qwen2'")
    # The same suite name, another prompt: the outputs answer other prompts (before: exit 0).
    (tmp_path / "other").mkdir()
    other = _suite(tmp_path / "other" / "s.jsonl", prompt_a="Tell me about dogs")
    assert main([*args, "--target", "tiny-llama", "--suite", str(other)]) == 2
    _err(capsys, "its suite 's' has hash")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-0.5"])
def test_estimate_temperature_must_be_a_finite_number(tmp_path, capsys, value):
    suite = _suite(tmp_path / "s.jsonl")
    with pytest.raises(SystemExit) as e:  # argparse: exit 2 with the usage line (before: nan, inf ran, exit 0)
        main(["estimate-acceptance", "--target", "tiny-llama", "--draft", "prompt-lookup", "--suite", str(suite),
              f"--temperature={value}"])
    assert e.value.code == 2
    _err(capsys, "--temperature", "finite number >= 0")


def test_estimate_checks_seed_and_k_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import harness.build
    suite = _suite(tmp_path / "s.jsonl")

    def must_not_load(*a, **k):
        raise AssertionError("the model loaded before the flags were checked")
    monkeypatch.setattr(harness.build, "get_model", must_not_load)
    args = ["estimate-acceptance", "--target", "tiny-llama", "--draft", "prompt-lookup", "--suite", str(suite)]
    assert main([*args, "--seed", "-1"]) == 2  # before: numpy's ValueError after every forward, exit 3
    _err(capsys, "--seed must be an integer >= 0, got -1")
    assert main([*args, "--k", "0"]) == 2  # before: said after the baseline outputs were generated
    _err(capsys, "--k must be >= 1, got 0")


# ------------------------------------------------------------------------------------------- bench

BENCH = ["bench", "--target", "tiny-llama", "--draft", "prompt-lookup", "--thresholds", "", "--no-hf",
         "--rounds", "1", "--max-new-tokens", "4", "--temperatures", "0", "--json"]


@pytest.mark.parametrize("bad", ["folder", "missing/parent/out.json"])
def test_bench_checks_out_before_the_run(tmp_path, capsys, monkeypatch, bad):
    import harness.commands.bench as bench

    def must_not_run(args):
        raise AssertionError("the bench ran before --out was checked")
    monkeypatch.setattr(bench, "run_bench", must_not_run)
    (tmp_path / "folder").mkdir()
    assert main([*BENCH, "--out", str(tmp_path / bad)]) == 2  # before: the bench ran (here: exit 3)
    _err(capsys, f"cannot write {tmp_path / bad}")


@pytest.mark.parametrize("flag, value, needle", [("--temperatures", "nan", "temperature must be >= 0, got nan"),
                                                 ("--temperatures", "0,inf", "temperature must be finite"),
                                                 ("--temperatures", "-1", "temperature must be >= 0"),
                                                 ("--max-new-tokens", "0", "--max-new-tokens must be >= 1")])
def test_bench_checks_temperatures_and_budget_before_the_run(capsys, monkeypatch, flag, value, needle):
    import harness.commands.bench as bench

    def must_not_run(args):
        raise AssertionError("the bench ran before its flags were checked")
    monkeypatch.setattr(bench, "run_bench", must_not_run)
    args = [a for a in BENCH if a not in ("--temperatures", "0", "--max-new-tokens", "4")]
    assert main([*args, f"{flag}={value}"]) == 2  # before: the bench loaded the models and warmed up first
    _err(capsys, needle)


def test_bench_prints_the_results_when_out_fails_after_the_run(tmp_path, capsys, monkeypatch):
    import harness.commands.bench as bench
    out = tmp_path / "gone" / "bench.json"
    out.parent.mkdir()

    def measured(args):  # the folder is removed during the run
        shutil.rmtree(out.parent)
        return {"measured": 1.5}
    monkeypatch.setattr(bench, "run_bench", measured)
    assert main([*BENCH, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"measured": 1.5}  # before: nothing printed, the results lost
    assert f"--out {out} was not written" in captured.err and "printed above" in captured.err


# ------------------------------------------------------------------------------------ suites import

def _req(content: str, **extra) -> dict:
    return {"model": "x", "messages": [{"role": "user", "content": content}], **extra}


def test_import_reads_a_log_with_a_bom(tmp_path):
    log = tmp_path / "bom.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(_req(f"q{i}")) + "\n" for i in range(3)).encode())
    out = tmp_path / "bom-suite.jsonl"
    # before: auto read the BOM'd first line as a prompts file (the JSON text became prompts)
    assert main(["suites", "import", str(log), "--out", str(out)]) == 0
    assert [it.messages[0]["content"] for it in load_suite(out).items] == ["q0", "q1", "q2"]
    # before: --format chat failed on line 1, "not valid JSON"
    assert main(["suites", "import", str(log), "--out", str(tmp_path / "chat.jsonl"), "--format", "chat"]) == 0


def test_import_keeps_line_separators_inside_json_strings(tmp_path):
    texts = ["one\u2028two", "three\u2029four", "five\u0085six"]
    log = tmp_path / "seps.jsonl"
    # ensure_ascii=False: the characters raw inside the strings, as JSON allows
    log.write_text("".join(json.dumps(_req(t), ensure_ascii=False) + "\r\n" for t in texts), encoding="utf-8")
    out = tmp_path / "seps-suite.jsonl"
    assert main(["suites", "import", str(log), "--out", str(out)]) == 0  # before: "line 1: not valid JSON"
    suite = load_suite(out)
    assert [it.messages[0]["content"] for it in suite.items] == texts
    assert [it.id for it in suite.items] == ["line-1", "line-2", "line-3"]


def test_import_budget_stop_and_settings_it_cannot_replay(tmp_path, capsys):
    reqs = [_req("a", max_tokens=None, max_completion_tokens=33),   # OpenAI's newer field
            _req("b", max_completion_tokens=21, stop="END"),
            _req("c", max_tokens=9, stop=["\n\n", "###"], n=2, presence_penalty=0.5, seed=7),
            _req("d", max_tokens=9, n=1, frequency_penalty=0, logit_bias={"50256": -100}, seed=8)]
    log = tmp_path / "settings.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    out = tmp_path / "settings-suite.jsonl"
    assert main(["suites", "import", str(log), "--out", str(out)]) == 0
    items = {it.messages[0]["content"]: it for it in load_suite(out).items}
    assert items["a"].max_new_tokens == 33  # before: 128, the default
    assert items["b"].max_new_tokens == 21 and items["b"].stop == ("END",)
    assert items["c"].stop == ("\n\n", "###") and items["d"].stop == ()
    err = capsys.readouterr().err
    assert err.count("cannot replay") == 1  # once, with counts
    assert "seed (2 requests)" in err and "n (1 request)" in err and "presence_penalty (1 request)" in err
    header = json.loads(out.read_text().split("\n")[0])
    assert header["source"]["not_replayed"] == {"logit_bias": 1, "n": 1, "presence_penalty": 1, "seed": 2}
    # A request with another stop is another request, not a duplicate.
    log.write_text(json.dumps(_req("e", stop="X")) + "\n" + json.dumps(_req("e", stop="Y")) + "\n")
    assert main(["suites", "import", str(log), "--out", str(tmp_path / "two.jsonl")]) == 0
    assert len(load_suite(tmp_path / "two.jsonl").items) == 2


@pytest.mark.parametrize("body", ['[{"messages": [{"role": "user", "content": "hi"}]}]\n',
                                  '[\n  {"messages": [{"role": "user", "content": "hi"}]}\n]\n'])
def test_import_refuses_a_json_array_instead_of_reading_it_as_prompts(tmp_path, capsys, body):
    log = tmp_path / "log.json"
    log.write_text(body)
    out = tmp_path / "out.jsonl"
    assert main(["suites", "import", str(log), "--out", str(out)]) == 2  # before: the JSON text became prompts
    _err(capsys, f"{log}:1: the log is a JSON array", "--format prompts")
    assert not out.exists()
    prompts = tmp_path / "inst.txt"  # a prompt that opens with a bracket is still a prompt
    prompts.write_text("[INST] tell me a joke\nsecond prompt\n")
    assert main(["suites", "import", str(prompts), "--out", str(out)]) == 0
    assert [it.prompt for it in load_suite(out).items] == ["[INST] tell me a joke", "second prompt"]


def test_import_names_the_line_that_is_not_utf8(tmp_path, capsys):
    log = tmp_path / "latin1.jsonl"
    good = json.dumps(_req("fine")).encode() + b"\n"
    log.write_bytes(good * 3 + b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n')
    assert main(["suites", "import", str(log), "--out", str(tmp_path / "o.jsonl")]) == 2
    _err(capsys, f"{log}:4: not UTF-8: byte 0xe9 at column 47")  # before: "in position 196", no line


def test_import_out_that_is_a_folder_or_another_file_is_named_and_kept(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(_req("hello")) + "\n")
    (tmp_path / "folder").mkdir()
    assert main(["suites", "import", str(log), "--out", str(tmp_path / "folder")]) == 2
    _err(capsys, "is a folder")  # before: "cannot read suite file: [Errno 21] Is a directory"
    notes = tmp_path / "notes.jsonl"
    notes.write_text("my notes, not a suite\n")
    assert main(["suites", "import", str(log), "--out", str(notes)]) == 2
    _err(capsys, f"--out {notes} exists and is not a suite file")  # before: "notes.jsonl:1: invalid JSON"
    assert notes.read_text() == "my notes, not a suite\n"


@pytest.mark.parametrize("flag, value", [("--name", "Bad Name"), ("--version", " "), ("--max-new-tokens", "0")])
def test_import_flags_are_named_not_a_temporary_file(tmp_path, capsys, flag, value):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(_req("hello")) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["suites", "import", str(log), "--out", str(out), flag, value]) == 2
    err = _err(capsys, flag)
    assert ".tmp" not in err  # before: the error named the temporary suite file (or the log's line 1)
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl.*"))


# -------------------------------------------------------------------------------- sync, exit-frontier

def test_sync_names_a_candidate_without_its_verdict(regress_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(regress_run, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    del summary["candidates"]["spec"]["verdict"]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    db = tmp_path / "m.db"
    assert main(["sync", str(run_dir), "--tracking-uri", f"sqlite:///{db}"]) == 2  # before: KeyError, exit 3
    _err(capsys, "candidate 'spec' has no verdict")
    assert not db.exists()  # refused before any upload began (before: a parent run half uploaded)


def test_sync_and_history_name_a_sqlite_store_that_cannot_be_one(regress_run, tmp_path, capsys):
    import time
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.db").write_text("not a database\n")
    for store in ("folder", "notes.db"):
        uri = f"sqlite:///{tmp_path / store}"
        t0 = time.monotonic()
        assert main(["sync", str(regress_run), "--tracking-uri", uri]) == 2
        assert main(["history", "--tracking-uri", uri, "--figure", "none"]) == 2
        # before: MLflow retried for about two minutes, then an OperationalError traceback, exit 3
        assert time.monotonic() - t0 < 60
        err = _err(capsys, f"tracking URI {uri}")
        assert ("is a folder" if store == "folder" else "is not an SQLite database") in err
    assert (tmp_path / "notes.db").read_text() == "not a database\n"


def test_frontier_suites_are_checked_before_the_run_folder(tmp_path, capsys):
    for suites in ("", " , ", "factual,factual"):
        run_dir = tmp_path / "frontier"
        assert main(["exit-frontier", "--target", "tiny-llama", f"--suites={suites}", "--run-dir", str(run_dir),
                     "--no-tracking", "--no-progress"]) == 2
        err = _err(capsys, "--suites must name one or more suites, each once")
        assert "frontier.toml" not in err and not run_dir.exists()


@pytest.mark.parametrize("margin", ["nan", "0", "1.5", "-0.1"])
def test_frontier_margin_is_checked_before_the_run_folder(tmp_path, capsys, margin):
    run_dir = tmp_path / "frontier"
    assert main(["exit-frontier", "--target", "tiny-llama", "--suites", "factual", f"--margin={margin}",
                 "--run-dir", str(run_dir), "--no-tracking", "--no-progress"]) == 2
    err = _err(capsys, "--margin must be a drop in pass rate in (0, 1]")
    assert "frontier.toml" not in err  # before: the error named the generated config
    assert not run_dir.exists()  # before: the folder was left behind


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")


@pytest.mark.parametrize("escape", [SystemExit(0), SystemExit(), _Unprintable(), GeneratorExit()])
def test_anything_escaping_a_command_is_exit_3_in_one_line(monkeypatch, capsys, escape):
    """Before issue 57 a SystemExit from a decoder's library exited 0 (CI green, no verdict), and an
    exception whose __str__ raises escaped the handler."""
    from harness.commands import bench

    def escapes(args):
        raise escape

    monkeypatch.setattr(bench, "run_bench", escapes)
    assert main(BENCH) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("decodegate: internal error: ") and type(escape).__name__ in err[-1]
