"""`watch` and `export-monitoring` without a real engine, on real components otherwise: reference
run folders written in the shape `regress` writes, an engine stand-in that is a real HTTP server
serving the captured vLLM /metrics (tests/data/vllm) with counters the test moves, watch run as
the console command, its own /metrics scraped, the exported rules run by `promtool test rules`.

The real engines are in test_watch_engine.py (llama.cpp) and test_vllm.py (vLLM)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from decoders.engines.server import free_port
from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
VLLM = ROOT / "tests" / "data" / "vllm"


def write_reference(folder: Path, requests: list[tuple[int, int, float]], *, engine: str | None = "vLLM",
                    decoder: str = "vllm", name: str = "ngram") -> Path:
    """A finished run folder: summary.json and records.jsonl with one candidate whose requests
    drafted `n` and accepted `a` tokens at temperature `t` ((a, n, t) per request)."""
    folder.mkdir(parents=True, exist_ok=True)
    cand = {"decoder": decoder, "labels": {"team": "inference-platform"}}
    if engine:
        cand["engine"] = {"engine": engine}
    summary = {"target": "smollm2-135m", "labels": {"chargeback": "llm-serving"}, "candidates": {name: cand}}
    (folder / "summary.json").write_text(json.dumps(summary))
    rows = [{"candidate": name, "suite": "s", "item_id": f"i{i}", "seed": 0, "temperature": t,
             "stats": {"proposed": n, "accepted": a}} for i, (a, n, t) in enumerate(requests)]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def steady_requests(count: int = 40, p: float = 0.6, n: int = 50, t: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(int(rng.binomial(n, p)), n, t) for _ in range(count)]


# --------------------------------------------------------------------------- engine names

def test_a_vllm_candidate_is_exported_with_vllm_names_only(tmp_path):
    ref = write_reference(tmp_path / "ref", steady_requests())
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m")]) == 0
    rules = (tmp_path / "m" / "decodegate-rules.yml").read_text()
    dash = (tmp_path / "m" / "decodegate-dashboard.json").read_text()
    for text in (rules, dash):
        assert "llamacpp:" not in text
        assert "vllm:spec_decode_num_draft_tokens_total" in text
    assert "vllm:generation_tokens_total" in rules
    # Every engine series the exports read is one a real vLLM server exported (the capture).
    scraped = {line.split("{")[0].split()[0] for line in (VLLM / "ngram-metrics-after.txt").read_text().splitlines()
               if line and not line.startswith("#")}
    used = set(re.findall(r"vllm:[a-z0-9_]+", rules + dash))
    assert used and used <= scraped, used - scraped


@pytest.mark.parametrize("engine,decoder,says", [
    ("sglang", "sglang", "ran on engine 'sglang'"),
    (None, "speculative", "not on a serving engine"),
])
def test_an_engine_without_verified_names_is_refused_not_defaulted(engine, decoder, says, tmp_path, capsys):
    ref = write_reference(tmp_path / "ref", steady_requests(), engine=engine, decoder=decoder)
    assert main(["export-monitoring", str(ref), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "llama.cpp and vllm only" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m").exists()
