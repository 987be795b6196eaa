"""`watch` and `export-monitoring` refuse bad input in one line, exit 2, before any engine or
MLflow is contacted (the real-engine behaviour is in test_watch_engine.py)."""
from __future__ import annotations

import pytest

from harness.cli import main


@pytest.mark.parametrize("flags,says", [
    (["--interval", "0"], "--interval must be a positive number"),
    (["--arl-hours", "nan"], "--arl-hours must be a positive number"),
    (["--arl-hours", "0.001", "--interval", "60"], "shorter than one --interval"),
    (["--min-drafted", "0"], "--min-drafted must be at least 1"),
    (["--dispersion", "0.5"], "--dispersion must be at least 1"),
    (["--tolerance", "1"], "--tolerance must lie in [0, 1)"),
    (["--drop", "1"], "--drop must lie in (0, 1)"),
    (["--stopped-tokens", "0"], "--stopped-tokens must be at least 1"),
    (["--max-scrape-failures", "-1"], "--max-scrape-failures must be at least 0"),
])
def test_watch_refuses_bad_settings(flags, says, capsys, tmp_path):
    assert main(["watch", "--engine", "http://127.0.0.1:9", "--reference", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_a_reference_that_is_not_a_run_is_named(capsys, tmp_path):
    assert main(["watch", "--engine", "http://127.0.0.1:9", "--reference", str(tmp_path / "nope")]) == 2
    assert "neither a run folder nor mlflow:RUN_ID" in capsys.readouterr().err
    assert main(["export-monitoring", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a finished run (needs summary.json and records.jsonl)" in capsys.readouterr().err


def test_help_says_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["watch", "--help"])
    out = capsys.readouterr().out
    assert "4 an alarm" in out and "--arl-hours" in out and "never changes the engine" in out
    assert "--exit-on-alarm" in out and "SIGUSR1" in out and "--max-scrape-failures" in out
