"""A verdict in minutes: the baseline store, fingerprints, sequential looks, --fail-fast and the
sample-size plan, end to end through `decodegate regress` on tiny models (issue 17)."""
from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from decoders import GenerationRequest, make_decoder
from harness.cli import main
from harness.models import load_model
from harness.run.store import BaselineStore, key_of
import helpers
from helpers import summary, write_regress_config

N_ITEMS = 60
WORDS = ["cats", "rivers", "stars", "bread", "music", "trains", "maps", "clouds", "glass", "wind"]


@pytest.fixture(scope="module")
def echo_suite(tmp_path_factory):
    """Each reference is the baseline's own greedy output: the baseline passes every item, a
    candidate that changes outputs fails them."""
    target = load_model("tiny-llama")
    dec = make_decoder("standard", target)
    folder = tmp_path_factory.mktemp("suite")
    rows = [{"suite": "echo", "version": "1", "description": "tiny echo suite", "smoke": ["e0", "e1"],
             "defaults": {"grader": "contains", "max_new_tokens": 8, "stop": []}}]
    for i in range(N_ITEMS):
        prompt = f"Item {i}: tell me about {WORDS[i % len(WORDS)]} and {WORDS[(i * 7) % len(WORDS)]}"
        text = dec.generate(GenerationRequest(tuple(target.encode(prompt)), max_new_tokens=8,
                                              stop_token_ids=target.stop_token_ids())).text
        rows.append({"id": f"e{i}", "prompt": prompt, "references": [" ".join(text.split()) or "\u0000never"],
                     "grader_options": {"case_sensitive": True}, "categories": ["echo"]})
    path = folder / "echo.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """tiny-llama saved as a folder: a target whose weights a test can change under the same name."""
    folder = tmp_path_factory.mktemp("model") / "tiny"
    m = load_model("tiny-llama")
    m.model.save_pretrained(folder)
    m.tokenizer.save_pretrained(folder)
    return folder


def config(tmp_path: Path, suite: Path, candidates: str, *, target="tiny-llama", looks=1, speed_items=10,
           margin=0.2, name="regress.toml") -> Path:
    return write_regress_config(tmp_path / name, target=target, candidates=candidates, profile_name="full",
                                suites={"echo": {"margin": margin, "path": str(suite)}},
                                profile={"subset": "full", "suites": ["echo"], "temperatures": [0.0], "seeds": [0],
                                         "looks": looks, "speed_items": speed_items})


EXACT = """
[[candidates]]
name = "spec"
decoder = "speculative"
options = { draft = "prompt-lookup", k = 3, verify = "coupled" }
"""
SAME = """
[[candidates]]
name = "lossy-same"
decoder = "standard"
kind = "lossy"
"""
WORSE = """
[[candidates]]
name = "lossy-other"
decoder = "standard"
kind = "lossy"
target = "tiny-qwen2"
"""


def regress(cfg: Path, run_dir: Path, *extra) -> int:
    return helpers.regress(cfg, run_dir, "--profile", "full", *extra)


def rows(run_dir: Path, candidate: str) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines() if x.strip()
            and json.loads(x)["candidate"] == candidate]


def verdicts(s: dict) -> dict:
    return {n: (c["verdict"], sorted((g["name"], g["status"]) for g in c["gates"])) for n, c in s["candidates"].items()}


# ------------------------------------------------------------------------------ reuse


@pytest.mark.full
def test_second_run_reuses_the_baseline_and_reaches_the_same_verdicts(tmp_path, echo_suite, monkeypatch):
    store = tmp_path / "store"
    cfg = config(tmp_path, echo_suite, EXACT + SAME)
    assert regress(cfg, tmp_path / "r1", "--baseline-store", str(store)) == 0
    first = summary(tmp_path / "r1")
    assert first["baseline_store"]["reused_rows"] == 0
    assert first["baseline_store"]["stored"] == N_ITEMS

    # Count the baseline's generations in the second run: only the re-timed subset may run. They
    # run in the decoders' worker processes (forked after this patch), so the count is a file.
    import decoders.standard as standard
    real = standard.StandardDecoder.generate
    tally = tmp_path / "calls"
    tally.write_text("")

    def counting(self, request):
        with open(tally, "a") as f:
            f.write("1\n")
        return real(self, request)

    monkeypatch.setattr(standard.StandardDecoder, "generate", counting)
    assert regress(cfg, tmp_path / "r2", "--baseline-store", str(store)) == 0
    second = summary(tmp_path / "r2")
    st = second["baseline_store"]
    assert st["reused_rows"] == N_ITEMS - 10 and st["baseline_rows"] == N_ITEMS
    assert st["retimed"] == 10 and st["retimed_disagreed"] == []
    assert st["from_runs"] == [first["run_uid"]]
    # 10 fresh baseline generations + 60 of the lossy candidate (also `standard`), none more.
    assert len(tally.read_text().splitlines()) == 10 + N_ITEMS
    assert verdicts(second) == verdicts(first)
    q1, q2 = (s["candidates"]["lossy-same"]["suites"]["echo"]["quality"] for s in (first, second))
    assert (q1["n"], q1["statistic"], q1["wins"], q1["losses"]) == (q2["n"], q2["statistic"], q2["wins"], q2["losses"])
    # Speed rests on the freshly timed rows only; quality and identity on all of them.
    assert second["candidates"]["spec"]["speedup"]["n"] == 10
    assert second["candidates"]["spec"]["suites"]["echo"]["identity"]["T=0"]["n"] == N_ITEMS
    reused = [r for r in rows(tmp_path / "r2", "baseline") if r.get("reused")]
    assert len(reused) == N_ITEMS - 10 and all(r["reused"]["run_uid"] == first["run_uid"] for r in reused)
    report = (tmp_path / "r2" / "report.txt").read_text()
    assert f"{N_ITEMS - 10} of {N_ITEMS} rows reused from {store}" in report

    # --fresh-baseline reads nothing.
    assert regress(cfg, tmp_path / "r3", "--baseline-store", str(store), "--fresh-baseline") == 0
    assert summary(tmp_path / "r3")["baseline_store"]["reused_rows"] == 0


@pytest.mark.full
def test_a_changed_model_under_the_same_name_reuses_nothing_and_cannot_resume(tmp_path, echo_suite, model_folder,
                                                                               capsys):
    import shutil
    folder = tmp_path / "tiny"
    shutil.copytree(model_folder, folder)
    store = tmp_path / "store"
    cfg = config(tmp_path, echo_suite, SAME, target=str(folder))
    assert regress(cfg, tmp_path / "r1", "--baseline-store", str(store)) == 0
    fp1 = rows(tmp_path / "r1", "baseline")[0]["target_fingerprint"]

    # "Fine-tune" it: one weight moves; the name and path stay.
    from safetensors.torch import load_file, save_file
    weights = folder / "model.safetensors"
    state = load_file(weights)
    name = next(k for k in state if k.endswith("mlp.down_proj.weight"))
    state[name] = state[name] + 1e-3
    save_file(state, weights, metadata={"format": "pt"})
    from harness import build
    build._MODELS.clear()  # a new process would load it afresh; this one caches models by name

    assert regress(cfg, tmp_path / "r2", "--baseline-store", str(store)) in (0, 1)
    second = summary(tmp_path / "r2")
    assert second["baseline_store"]["reused_rows"] == 0
    assert rows(tmp_path / "r2", "baseline")[0]["target_fingerprint"] != fp1
    # Resuming the first folder with the changed model is refused, naming the fingerprints.
    build._MODELS.clear()
    capsys.readouterr()
    assert main(["regress", "--config", str(cfg), "--profile", "full", "--run-dir", str(tmp_path / "r1"),
                 "--no-progress", "--no-tracking", "--baseline-store", str(store)]) == 2
    assert f"was made with other models or decoder code (baseline target {fp1} ->" in capsys.readouterr().err


def test_a_run_folder_made_by_other_decoder_code_cannot_resume(tmp_path, echo_suite, capsys, monkeypatch):
    """A resumed folder whose rows came from other decoder code (a fix, or a regression, in the
    forward every decoder runs) is refused, naming the code fingerprints: the first rows would
    otherwise be judged with the new ones and the run certify code that never made them."""
    import shutil
    import decoders
    from harness.run import fingerprint as fpr
    cfg = config(tmp_path, echo_suite, SAME, speed_items=0)
    assert regress(cfg, tmp_path / "r1", "--baseline-store", "none") == 0
    code = rows(tmp_path / "r1", "baseline")[0]["code_fingerprint"]
    copy = tmp_path / "decoders"
    shutil.copytree(Path(decoders.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__", "engines"))
    (copy / "lean.py").write_text((copy / "lean.py").read_text() + "\n# edited\n")
    monkeypatch.setattr(fpr, "DECODERS_DIR", copy)
    capsys.readouterr()
    assert regress(cfg, tmp_path / "r1", "--baseline-store", "none") == 2
    err = capsys.readouterr().err
    assert f"was made with other models or decoder code (baseline code {code} ->" in err
    assert "lossy-same code" in err


def test_corrupt_and_unreadable_store_rows_are_skipped_with_a_warning(tmp_path, echo_suite, capsys):
    store = tmp_path / "store"
    cfg = config(tmp_path, echo_suite, SAME, speed_items=0)
    assert regress(cfg, tmp_path / "r1", "--baseline-store", str(store)) == 0
    files = sorted(store.rglob("*.json"))
    assert len(files) == N_ITEMS
    files[0].write_text(files[0].read_text()[:50])                      # torn
    body = json.loads(files[1].read_text())
    body["key_parts"]["request"]["seed"] = 99                           # content that is not its key
    files[1].write_text(json.dumps(body))
    capsys.readouterr()
    assert regress(cfg, tmp_path / "r2", "--baseline-store", str(store)) == 0
    err = capsys.readouterr().err
    assert str(files[0]) in err and str(files[1]) in err and "skipped" in err
    st = summary(tmp_path / "r2")["baseline_store"]
    # speed_items = 0: one stored row is still generated again to re-check the store
    assert st["reused_rows"] == N_ITEMS - 3 and len(st["skipped"]) == 2 and st["retimed"] == 1
    # The skipped rows were generated again and stored whole.
    assert all(json.loads(f.read_text())["key"] == f.stem for f in files[:2])


@pytest.mark.full
def test_a_store_that_cannot_be_read_generates_everything_and_loses_nothing(tmp_path, echo_suite, capsys):
    store = tmp_path / "store"
    cfg = config(tmp_path, echo_suite, SAME, speed_items=0)
    assert regress(cfg, tmp_path / "r1", "--baseline-store", str(store)) == 0
    # Not a folder (also what an unmounted or mistyped path looks like): warned, then generated.
    not_a_folder = tmp_path / "store.txt"
    not_a_folder.write_text("x")
    assert regress(cfg, tmp_path / "r2", "--baseline-store", str(not_a_folder)) == 0
    assert "is not a folder" in capsys.readouterr().err
    s = summary(tmp_path / "r2")
    assert s["baseline_store"]["reused_rows"] == 0 and s["baseline_store"]["baseline_rows"] == N_ITEMS
    assert s["verdict"] == "pass"
    if os.geteuid() != 0:  # root reads any folder: a permission check needs another user
        store.chmod(0)
        try:
            assert regress(cfg, tmp_path / "r3", "--baseline-store", str(store)) == 0
        finally:
            store.chmod(0o755)
        assert "not readable" in capsys.readouterr().err
        assert summary(tmp_path / "r3")["baseline_store"]["reused_rows"] == 0


def _hammer(root: str, n: int, seed: int) -> None:
    store = BaselineStore(root)
    for i in range(n):
        parts = {"item": i % 5}
        store.put(key_of(parts), parts, {"tokens": [seed] * 2000, "text": str(seed) * 4000}, {"writer": seed})


@pytest.mark.full  # four writer processes racing (8 s); the store's atomic rename is used by every run in make check
def test_concurrent_writers_never_tear_a_row(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), 200, s)) for s in (1, 2)]
    for p in procs:
        p.start()
    reader = BaselineStore(tmp_path, writable=False)
    seen = 0
    while any(p.is_alive() for p in procs):
        for i in range(5):
            row = reader.get(key_of({"item": i}))
            if row is not None:
                seen += 1
                assert len(set(row["result"]["tokens"])) == 1   # one writer's row, whole
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert reader.skipped == []
    assert seen > 0
    assert not list(tmp_path.rglob("*.tmp"))


# `full`: two regress runs logged to MLflow (29 s of a quiet `make check`, most of it MLflow's
# logging); the store's reuse, fingerprints and retiming stay in `make check` on the folder store.
@pytest.mark.full
def test_store_from_a_logged_mlflow_run(tmp_path, echo_suite, mlflow_sqlite):
    uri = mlflow_sqlite
    cfg = config(tmp_path, echo_suite, SAME, speed_items=0)
    args = ["regress", "--config", str(cfg), "--profile", "full", "--no-progress", "--tracking-uri", uri,
            "--baseline-store", str(tmp_path / "store")]
    assert main([*args, "--run-dir", str(tmp_path / "r1")]) == 0
    parent = json.loads((tmp_path / "r1" / "tracking.json").read_text())["runs"]["parent"]
    args[-1] = f"mlflow:{parent}"
    assert main([*args, "--run-dir", str(tmp_path / "r2")]) == 0
    st = summary(tmp_path / "r2")["baseline_store"]
    assert st["reused_rows"] == N_ITEMS - 1 and st["retimed"] == 1 and not st["retimed_disagreed"]
    assert st["store"] == f"mlflow:{parent}"


# ------------------------------------------------------------------------ sequential looks


def test_a_clearly_worse_candidate_stops_at_the_first_look(tmp_path, echo_suite):
    cfg = config(tmp_path, echo_suite, WORSE, looks=3)
    assert regress(cfg, tmp_path / "run") == 1
    s = summary(tmp_path / "run")
    cand = s["candidates"]["lossy-other"]
    seq = cand["suites"]["echo"]["quality"]["sequential"]
    assert seq["decided"] == "worse" and seq["look"] == 1
    assert len(rows(tmp_path / "run", "lossy-other")) == N_ITEMS // 3          # the other 40 never ran
    assert cand["stopped"][0]["reason"] == "worse"
    gate = next(g for g in cand["gates"] if g["name"] == "quality echo")
    assert gate["status"] == "fail" and gate["detail"].startswith("worse at look 1 of 3")


def test_an_unchanged_lossy_candidate_stops_once_non_inferior(tmp_path, echo_suite):
    cfg = config(tmp_path, echo_suite, SAME + WORSE, looks=3)
    regress(cfg, tmp_path / "run")
    cand = summary(tmp_path / "run")["candidates"]["lossy-same"]
    seq = cand["suites"]["echo"]["quality"]["sequential"]
    assert seq["decided"] == "non-inferior" and seq["look"] < 3
    n = len(rows(tmp_path / "run", "lossy-same"))
    assert n == seq["looks"][-1]["n"] < N_ITEMS
    gate = next(g for g in cand["gates"] if g["name"] == "quality echo")
    assert gate["status"] == "pass" and "non-inferior at look" in gate["detail"]
    # Both candidates stopped: the baseline ran only where one of them needed it.
    assert len(rows(tmp_path / "run", "baseline")) == n


@pytest.mark.full
def test_a_run_stopped_by_looks_resumes_to_the_same_verdict(tmp_path, echo_suite):
    cfg = config(tmp_path, echo_suite, WORSE, looks=3)
    assert regress(cfg, tmp_path / "run") == 1
    before = summary(tmp_path / "run")
    assert regress(cfg, tmp_path / "run") == 1                 # resume: nothing new runs
    assert len(rows(tmp_path / "run", "lossy-other")) == N_ITEMS // 3
    assert verdicts(summary(tmp_path / "run")) == verdicts(before)


# ------------------------------------------------------------------------------ fail-fast


@pytest.mark.full
def test_fail_fast_stops_a_broken_exact_candidate_at_its_first_real_divergence(tmp_path, echo_suite,
                                                                                broken_greedy_verifier):
    cfg = config(tmp_path, echo_suite, """
[[candidates]]
name = "spec-broken"
decoder = "speculative"
options = { draft = "tiny-qwen2", k = 3 }
""")
    assert regress(cfg, tmp_path / "run", "--fail-fast") == 1
    cand_rows = rows(tmp_path / "run", "spec-broken")
    assert len(cand_rows) < N_ITEMS
    last, base = cand_rows[-1], {r["item_id"]: r for r in rows(tmp_path / "run", "baseline")}
    assert last["tokens"] != base[last["item_id"]]["tokens"]            # it stopped on a divergence
    assert all(r["tokens"] == base[r["item_id"]]["tokens"] for r in cand_rows[:-1])
    cand = summary(tmp_path / "run")["candidates"]["spec-broken"]
    assert any(g["name"] == "fail-fast" and g["status"] == "fail" for g in cand["gates"])
    # Without the flag the same candidate runs every item.
    assert regress(cfg, tmp_path / "run2") == 1
    assert len(rows(tmp_path / "run2", "spec-broken")) == N_ITEMS


def test_fail_fast_leaves_a_correct_exact_candidate_alone(tmp_path, echo_suite):
    cfg = config(tmp_path, echo_suite, EXACT)
    assert regress(cfg, tmp_path / "run", "--fail-fast") == 0
    assert len(rows(tmp_path / "run", "spec")) == N_ITEMS


# ---------------------------------------------------------------------------- the plan


@pytest.mark.full  # a plan printed before a run (6 s): what it reads, not a verdict
def test_plan_says_before_the_run_what_the_profile_can_decide(tmp_path, echo_suite, capsys):
    cfg = config(tmp_path, echo_suite, SAME + WORSE, margin=0.1)
    assert main(["regress", "--config", str(cfg), "--profile", "full", "--plan-only"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.strip().startswith("lossy-same"))
    assert "cannot decide: about 144 items would" in line and f"{N_ITEMS:>5}" in line   # 0.20 stated
    assert not (tmp_path / "runs").exists()
    # From a run that observed the discordance: lossy-same disagrees on nothing, lossy-other on all.
    regress(config(tmp_path, echo_suite, SAME + WORSE, margin=0.1), tmp_path / "r1")
    capsys.readouterr()
    assert main(["regress", "--config", str(cfg), "--profile", "full", "--plan-only", "--plan-from",
                 str(tmp_path / "r1")]) == 0
    lines = capsys.readouterr().err.splitlines()
    same = next(x for x in lines if x.strip().startswith("lossy-same"))
    other = next(x for x in lines if x.strip().startswith("lossy-other"))
    assert "observed" in same and "can decide" in same
    assert "observed" in other and "cannot decide" in other


def test_profile_candidates_and_looks_are_validated(tmp_path, echo_suite):
    from harness.config import ConfigError, load_config
    cfg = config(tmp_path, echo_suite, SAME)
    text = cfg.read_text()
    cfg.write_text(text.replace("looks = 1", "looks = 0"))
    with pytest.raises(ConfigError, match="looks must be an integer >= 1"):
        load_config(cfg, "full")
    cfg.write_text(text.replace("looks = 1", 'candidates = ["lossy-sam"]'))
    with pytest.raises(ConfigError, match="did you mean 'lossy-same'"):
        load_config(cfg, "full")
    cfg.write_text(text + '[gates]\nspending = "fast"\n')
    with pytest.raises(ConfigError, match="spending must be one of"):
        load_config(cfg, "full")


def test_an_mlflow_store_on_a_server_that_is_down_is_refused_before_any_model_loads(tmp_path, echo_suite, capsys):
    cfg = config(tmp_path, echo_suite, SAME)
    assert main(["regress", "--config", str(cfg), "--profile", "full", "--run-dir", str(tmp_path / "run"),
                 "--no-progress", "--tracking-uri", "http://127.0.0.1:1", "--baseline-store", "mlflow:0123"]) == 2
    assert "baseline store mlflow:0123: tracking server http://127.0.0.1:1 is not reachable" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------- reuse that fails closed (issue 21)


def tamper(store: Path) -> None:
    """Every stored row's content changed, its key not: each file still hashes to its name."""
    for f in store.rglob("*.json"):
        row = json.loads(f.read_text())
        toks, margins = row["result"]["tokens"], row["result"]["margins"]
        at = max(range(len(toks)), key=lambda i: margins[i] if margins[i] is not None else -1)
        toks[at] = (toks[at] + 1) % 250                          # a flip where the baseline was sure
        f.write_text(json.dumps(row))


def test_a_tampered_store_row_is_caught_by_retiming_and_nothing_is_reused(tmp_path, echo_suite, capsys):
    store = tmp_path / "store"
    cfg = config(tmp_path, echo_suite, EXACT + SAME)
    assert regress(cfg, tmp_path / "r1", "--baseline-store", str(store)) == 0
    first = summary(tmp_path / "r1")
    assert regress(cfg, tmp_path / "reused", "--baseline-store", str(store)) == 0    # takes 50 stored rows
    tamper(store)
    # Resuming the run that took stored rows: its re-timed rows now differ, so the rows it took are
    # suspect, and it stops naming the items instead of finishing on them.
    capsys.readouterr()
    assert regress(cfg, tmp_path / "reused", "--baseline-store", str(store)) == 2
    err = capsys.readouterr().err
    assert "rows of this run were taken from the baseline store" in err and "echo/e" in err
    assert regress(cfg, tmp_path / "r2", "--baseline-store", str(store)) == 0
    st = summary(tmp_path / "r2")["baseline_store"]
    assert st["reused_rows"] == 0 and st["baseline_rows"] == N_ITEMS      # regenerated, not reused
    assert st["retimed"] == 10 and len(st["retimed_disagreed"]) == 10
    assert all(d.startswith("echo/e") for d in st["retimed_disagreed"])
    assert st["reuse_refused"] and "differ from the stored" in st["reuse_refused"]
    assert "differ from the stored" in capsys.readouterr().err
    report = (tmp_path / "r2" / "report.txt").read_text()
    assert "0 of 60 rows reused" in report and "differ from the stored" in report
    assert verdicts(summary(tmp_path / "r2")) == verdicts(first)
    # Nothing of the tampered content reached the records.
    fresh = {r["item_id"]: r["tokens"] for r in rows(tmp_path / "r1", "baseline")}
    assert all(r["tokens"] == fresh[r["item_id"]] for r in rows(tmp_path / "r2", "baseline"))


@pytest.mark.full  # 9 s; retiming a stored row stays in make check in the tampered-row test above
def test_without_a_speed_sample_one_stored_row_is_still_rechecked(tmp_path, echo_suite):
    """`speed_items = 0`: the re-check had no sample row, so every tampered stored row was taken."""
    store = tmp_path / "store"
    cfg = config(tmp_path, echo_suite, EXACT, speed_items=0)
    assert regress(cfg, tmp_path / "r1", "--baseline-store", str(store)) == 0  # an empty store: all generated
    tamper(store)
    assert regress(cfg, tmp_path / "r2", "--baseline-store", str(store)) == 0
    st = summary(tmp_path / "r2")["baseline_store"]
    assert st["retimed"] == 1 and len(st["retimed_disagreed"]) == 1 and st["reuse_refused"]
    assert st["reused_rows"] == 0 and st["baseline_rows"] == N_ITEMS
    fresh = {r["item_id"]: r["tokens"] for r in rows(tmp_path / "r1", "baseline")}
    assert all(r["tokens"] == fresh[r["item_id"]] for r in rows(tmp_path / "r2", "baseline"))


def two_suites(tmp_path: Path, echo_suite: Path) -> tuple[Path, Path]:
    """The echo items split into two suites, 40 and 20 items, each in two categories."""
    head, *items = [json.loads(x) for x in echo_suite.read_text().splitlines()]
    out = []
    for name, part in (("alpha", items[:40]), ("beta", items[40:])):
        rows_ = [{**head, "suite": name, "smoke": [part[0]["id"]]}]
        rows_ += [{**it, "categories": ["odd" if i % 2 else "even"]} for i, it in enumerate(part)]
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows_) + "\n")
        out.append(path)
    return out[0], out[1]


@pytest.mark.full  # 12 s of two suites' runs; the suite's speed bound from a subset is tested in test_speed_bound.py
def test_the_speed_subset_of_a_multi_suite_profile_covers_every_suite(tmp_path, echo_suite):
    a, b = two_suites(tmp_path, echo_suite)
    cfg = tmp_path / "two.toml"
    cfg.write_text(f"""
target = "tiny-llama"
[baseline]
name = "baseline"
decoder = "standard"
{EXACT}
[suites.alpha]
path = "{a}"
[suites.beta]
path = "{b}"
[profiles.full]
subset = "full"
suites = ["alpha", "beta"]
temperatures = [0.0]
seeds = [0]
speed_items = 9
""")
    store = tmp_path / "store"
    assert regress(cfg, tmp_path / "r1", "--baseline-store", str(store)) == 0
    assert regress(cfg, tmp_path / "r2", "--baseline-store", str(store)) == 0
    s = summary(tmp_path / "r2")
    fresh = [r for r in rows(tmp_path / "r2", "baseline") if not r.get("reused")]
    by_suite = {n: sum(r["suite"] == n for r in fresh) for n in ("alpha", "beta")}
    assert by_suite == {"alpha": 6, "beta": 3}                               # 40:20, in proportion
    assert all(r.get("speed_sample") for r in fresh)
    assert {r["categories"][0] for r in fresh if r["suite"] == "alpha"} == {"odd", "even"}
    sp = s["candidates"]["spec"]["speedup"]
    assert sp["n"] == 9 and sp["rests_on"]["by_suite"] == {"alpha": 6, "beta": 3}
    assert s["baseline_store"]["speed_sample"]["by_suite"] == {"alpha": 6, "beta": 3}
    assert "speed rests on 9 items (alpha 6, beta 3)" in (tmp_path / "r2" / "report.txt").read_text()
    # Another run draws other items (seeded by the run), still in proportion.
    assert regress(cfg, tmp_path / "r3", "--baseline-store", str(store)) == 0
    again = {(r["suite"], r["item_id"]) for r in rows(tmp_path / "r3", "baseline") if not r.get("reused")}
    assert again != {(r["suite"], r["item_id"]) for r in fresh}
    assert summary(tmp_path / "r3")["baseline_store"]["speed_sample"]["by_suite"] == {"alpha": 6, "beta": 3}


@pytest.fixture(scope="module")
def store_of_a_module_fixture():
    """Where a module-scoped fixture's `regress` would store its baseline (the real-model runs
    of tests/test_exactness_int8.py are such fixtures)."""
    from harness.run.store import default_root
    return default_root()


def test_a_module_fixture_never_writes_to_the_users_store(store_of_a_module_fixture, tmp_path_factory):
    from harness.models import cache_dir
    assert tmp_path_factory.getbasetemp() in store_of_a_module_fixture.parents
    assert cache_dir() not in store_of_a_module_fixture.parents
