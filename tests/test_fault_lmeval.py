"""Faults in the stages after generation: an `lmeval:<task>` suite generates through each
decoder's worker too, so a decoder that exits, is killed, hangs or raises there is that
candidate's FAIL in the same run (its line naming the lm-eval request and the cause), the other
candidates are judged, and a baseline's break is exit 2. Before, lm-eval built each decoder again
in decodegate's own process, from model args: this test decoder's own options were refused
(exit 2, nothing generated), and its faults would have run in decodegate itself.

The test decoder is the fault matrix's (tests/test_fault_matrix.py): it applies its fault on its
`at`-th `generate_many` call; items a, b and c of the ordinary suite are calls 1-3, the lm-eval
task's requests are calls 4 onwards.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from test_fault_matrix import _regress, _rows, faulty  # noqa: E402,F401 - faulty: the matrix's fixture

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TASK = "decodegate_tiny_gen"
LOCAL = Path(__file__).parent / "data" / "lmeval"
AT = 5  # the task's second request
# fault -> (the gate that fails, words of its line)
EXPECT = {
    "sys-exit": ("raised", f"raised SystemExit on lmeval:{TASK}/request 2 (T=0, seed 0)"),
    "os-exit-0": ("crashed", f"crashed on lmeval:{TASK}/request 2 (T=0, seed 0): exited with status 0"),
    "sigkill": ("crashed", f"crashed on lmeval:{TASK}/request 2 (T=0, seed 0): killed by SIGKILL"),
    "hang-gil": ("hung", f"hung on lmeval:{TASK}/request 2 (T=0, seed 0): no result after"),
    "raise": ("raised", f"raised IndexError on lmeval:{TASK}/request 2 (T=0, seed 0) at faulty.py:"),
    "keyboard-interrupt": ("raised", f"raised KeyboardInterrupt on lmeval:{TASK}/request 2"),
}


def _config(root: Path, baseline: dict, candidates: dict[str, dict]) -> Path:
    suite = root / "s.jsonl"
    rows = [{"suite": "s", "version": "1", "description": "d", "smoke": list("abc"),
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}}]
    rows += [{"id": i, "prompt": f"item {i}", "references": ["zz"]} for i in "abc"]
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def table(opts: dict) -> str:
        if not opts:
            return 'decoder = "standard"\n'
        return f'decoder = "faulty:Faulty"\noptions = {{ fault = "{opts["fault"]}", at = {opts["at"]} }}\n'
    cands = "".join(f'[[candidates]]\nname = "{n}"\n{table(o)}' for n, o in candidates.items())
    cfg = root / "regress.toml"
    cfg.write_text(f'target = "tiny-llama"\n[baseline]\nname = "baseline"\n{table(baseline)}{cands}'
                   f'[suites.s]\npath = "{suite}"\n'
                   f'[suites."lmeval:{TASK}"]\ninclude_path = "{LOCAL}"\nlimit = 3\nmax_gen_toks = 4\n'
                   f'[profiles.smoke]\nsubset = "smoke"\nsuites = ["s", "lmeval:{TASK}"]\n'
                   f'temperatures = [0.0]\nseeds = [0]\n')
    return cfg


def _failed(summary: dict, name: str) -> dict:
    cand = summary["candidates"][name]
    return {g["name"]: g["detail"] for g in cand["gates"] if g["status"] == "fail"} if cand["verdict"] == "fail" else {}


def test_a_decoder_that_breaks_inside_lm_eval_fails_alone_in_the_same_run(faulty):
    named = {f.replace("-", "_"): f for f in EXPECT}
    cfg = _config(faulty, {}, {"fine": {}, **{n: {"fault": f, "at": AT} for n, f in named.items()}})
    run_dir = faulty / "run"
    for attempt in range(2):  # the rerun keeps every verdict (a death is remembered) and every row
        before = _rows(run_dir)
        code = _regress(cfg, run_dir)
        assert code == 1, (attempt, code)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["candidates"]["fine"]["verdict"] == "pass"  # judged in the same run
        for name, fault in named.items():
            gate, words = EXPECT[fault]
            failed = _failed(summary, name)
            assert gate in failed and words in failed[gate], (fault, failed)
        assert _rows(run_dir)[:len(before)] == before
    lm_rows = [json.loads(r) for r in _rows(run_dir) if json.loads(r)["suite"] == f"lmeval:{TASK}"]
    assert sorted({r["candidate"] for r in lm_rows}) == ["baseline", "fine"]  # a broken one's unit wrote none


def test_a_baseline_that_exits_inside_lm_eval_stops_the_run_with_exit_2(faulty):
    cfg = _config(faulty, {"fault": "sys-exit", "at": AT}, {"fine": {}})
    run_dir = faulty / "run"
    code = _regress(cfg, run_dir)
    assert code == 2
    assert not (run_dir / "summary.json").exists()
    assert sum(json.loads(r)["suite"] == "s" for r in _rows(run_dir)) == 6  # the suite's rows are kept
