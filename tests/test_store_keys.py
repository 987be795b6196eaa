"""What a baseline store key covers, how the store writes a row, and the speed sample (issue 21).

Unit level, on real objects: fingerprints of real files, tiny models and unstarted engine
servers, a real store folder. The same defects through `regress` (and a real llama.cpp server)
are in tests/test_baseline_reuse.py and tests/test_engine_reuse.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from decoders.engines.server import EngineServer, EngineSpec
from harness.run import fingerprint as fpr
from harness.run.store import BaselineStore, key_of


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """file_digest remembers digests in the user cache: each test its own."""
    monkeypatch.setenv("DECODEGATE_CACHE", str(tmp_path / "cache"))


def launched(*command: str, env: dict | None = None) -> EngineServer:
    """An engine server as `harness.run.engines.started` leaves it after launch (never started here)."""
    server = EngineServer(EngineSpec(name="e", launch=tuple(command), env=env or {}))
    server.command = [a.replace("{port}", "8080") for a in command]
    server.info = {"engine": "llama.cpp", "version": "b1", "models": ["m"]}
    return server


# ------------------------------------------------------------------------------ engine keys


def test_engine_files_are_keyed_by_full_path_and_flag_forms_are_hashed(tmp_path, own_cache):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b, c = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf", tmp_path / "c.gguf"
    for f, body in ((a, b"weights-a"), (b, b"weights-b"), (c, b"weights-c")):
        f.write_bytes(body)
    two = ("srv", "-m", str(a), "--spec-draft-model", str(b), "--port", "{port}")
    before = fpr.engine_fingerprint(launched(*two))
    assert str(a) in before["files"] and str(b) in before["files"]   # two model.gguf: both kept
    a.write_bytes(b"weights-a, requantized")
    assert fpr.engine_fingerprint(launched(*two)) != before          # the first one counts too
    flag = ("srv", f"--model={c}", "--port={port}")
    before = fpr.engine_fingerprint(launched(*flag))
    c.write_bytes(b"weights-c, requantized")
    assert fpr.engine_fingerprint(launched(*flag)) != before, "--model=PATH must be hashed"


def test_a_file_rewritten_with_its_old_size_and_mtime_gets_a_new_digest(tmp_path, own_cache):
    """`cp -p`, `rsync -a` or a reproducible build keep a file's mtime; a requantized GGUF can keep
    its size. The remembered digest must not outlive the content (red-team finding)."""
    import os
    f = tmp_path / "model.gguf"
    f.write_bytes(b"weights-a")
    st = f.stat()
    before = fpr.file_digest(f)
    f.write_bytes(b"weights-b")                                   # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))              # the mtime set back
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    assert fpr.file_digest(f) != before
    assert fpr.file_digest(f) == fpr.file_digest(f)               # and remembered again


def test_engine_key_has_the_processor_and_the_launch_environment(tmp_path, own_cache, monkeypatch):
    monkeypatch.delenv("LLAMA_ARG_THREADS", raising=False)
    cmd = ("srv", "--port", "{port}")
    plain = fpr.engine_fingerprint(launched(*cmd))
    assert plain["processor"]["cpu"] == fpr._processor("cpu")
    assert fpr.engine_fingerprint(launched(*cmd, env={"LLAMA_ARG_UBATCH": "256"})) != plain
    # LLAMA_ARG_* inherited from our own environment sets a flag just as well.
    monkeypatch.setenv("LLAMA_ARG_THREADS", "2")
    assert fpr.engine_fingerprint(launched(*cmd)) != plain


ZEN2 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC
cpu MHz\t\t: 2595.124
flags\t\t: fpu sse4_2 avx fma f16c avx2 hypervisor
bogomips\t: 5190.24

processor\t: 1
vendor_id\t: AuthenticAMD
"""
ZEN5 = ZEN2.replace("cpu family\t: 23", "cpu family\t: 26").replace("model\t\t: 49", "model\t\t: 2").replace(
    "avx2 hypervisor", "avx2 avx512f avx512bw avx512vl avx512_bf16 hypervisor")


def test_two_processors_under_one_model_name_key_apart(tmp_path, monkeypatch):
    """A virtual machine showed "AMD EPYC" for a Zen 2 without AVX-512 and a Zen 5 with it: other
    kernels, other rounding, so a baseline from one is no baseline for the other. The same chip
    at another clock, or on another host, still keys alike."""
    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(fpr, "CPUINFO", info)

    def kind(text):
        info.write_text(text)
        return fpr._processor("cpu"), fpr.environment("cpu"), fpr.host_processors()

    zen2, zen5 = kind(ZEN2), kind(ZEN5)
    assert zen2[0] != zen5[0] and zen2[1] != zen5[1] and zen2[2] != zen5[2]
    assert "AMD EPYC" in zen2[0] and "avx512f" in zen5[0] and "avx512f" not in zen2[0]
    # without AVX-512 but a later model: still another kind
    assert kind(ZEN2.replace("model\t\t: 49", "model\t\t: 113"))[0] != zen2[0]
    # the same chip, another clock, another bogomips, no hypervisor flag: the same kind
    same = ZEN2.replace("2595.124", "3300.000").replace("5190.24", "5200.00").replace(" hypervisor", "")
    assert kind(same)[0] == zen2[0]


def test_engine_client_code_is_fingerprinted_from_its_source(tmp_path, monkeypatch):
    from decoders.engines.llamacpp import LlamaCppDecoder
    import decoders.engines as engines
    before = fpr.engine_client_fingerprint(LlamaCppDecoder)
    copy = tmp_path / "engines"
    shutil.copytree(Path(engines.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    src = (copy / "llamacpp.py").read_text()
    assert '"min_p": 0.0' in src
    (copy / "llamacpp.py").write_text(src.replace('"min_p": 0.0', '"min_p": 0.05'))   # request building
    monkeypatch.setattr(fpr, "ENGINE_CLIENT_DIR", copy)
    assert fpr.engine_client_fingerprint(LlamaCppDecoder) != before


def test_in_process_decoder_code_is_fingerprinted_down_its_import_path(tmp_path, monkeypatch):
    """The baseline's key changes with any module a one-token step runs (the lean forward, the
    cache, the panel kernel's C source), not only with the decoder's own file; a decoder the
    baseline does not run leaves it alone. Found by a red-team pass: an edit to lean.py kept the
    key, and 50 stale rows of 60 were taken from the store."""
    from decoders.standard import StandardDecoder
    import decoders
    standard = object.__new__(StandardDecoder)
    before = fpr.code_fingerprint(standard)
    copy = tmp_path / "decoders"
    shutil.copytree(Path(decoders.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__", "engines"))
    monkeypatch.setattr(fpr, "DECODERS_DIR", copy)
    assert fpr.code_fingerprint(standard) == before   # the same source in another place
    for name in ("lean.py", "kv.py", "panel.c"):
        f = copy / name
        saved = f.read_text()
        f.write_text(saved + "\n/* edited */\n" if name.endswith(".c") else saved + "\n# edited\n")
        assert fpr.code_fingerprint(standard) != before, name
        f.write_text(saved)
    (copy / "early_exit.py").write_text((copy / "early_exit.py").read_text() + "\n# edited\n")
    assert fpr.code_fingerprint(standard) == before


# ------------------------------------------------------------------------------- model keys


def test_model_fingerprint_covers_config_and_non_persistent_buffers():
    from harness.models import load_model
    ref = fpr.model_fingerprint(load_model("tiny-llama"))
    assert fpr.model_fingerprint(load_model("tiny-llama")) == ref           # stable across loads
    theta = load_model("tiny-llama")
    theta.model.config.rope_parameters = {**theta.model.config.rope_parameters, "rope_theta": 5e5}
    assert fpr.model_fingerprint(theta) != ref, "a config field (rope_theta) must change the fingerprint"
    scaled = load_model("tiny-llama")
    scaled.model.config.rope_scaling = {"rope_type": "linear", "factor": 2.0}
    assert fpr.model_fingerprint(scaled) != ref
    buf = load_model("tiny-llama")
    rotary = buf.model.model.rotary_emb
    assert "inv_freq" in rotary._non_persistent_buffers_set                  # not in the state dict
    rotary.inv_freq.mul_(1.0001)
    assert fpr.model_fingerprint(buf) != ref, "a non-persistent buffer must change the fingerprint"
    attn = load_model("tiny-llama")
    assert attn.model.config._attn_implementation == "sdpa"
    attn.model.config._attn_implementation = "eager"                          # not in to_dict()
    assert fpr.model_fingerprint(attn) != ref, "the attention implementation must change the fingerprint"


# ------------------------------------------------------------------------------ store writes


def test_store_writes_nan_margins_as_the_records_do(tmp_path):
    from harness.run.records import RecordWriter, read_records
    store = BaselineStore(tmp_path / "store")
    parts = {"item": 1}
    result = {"tokens": [5, 6, 7], "text": "abc", "margins": [0.5, float("nan"), float("inf")],
              "stats": {"alpha": float("nan")}, "timing": {"wall_s": 0.1}}
    assert store.put(key_of(parts), parts, result, {"run_uid": "r"}) is True
    assert store.writable                                       # one row never switches the store off
    row = store.get(key_of(parts))
    assert row["result"]["margins"] == [0.5, None, None] and row["result"]["stats"] == {"alpha": None}
    writer = RecordWriter(tmp_path)
    writer.write(dict(result))
    writer.close()
    assert read_records(tmp_path)[0]["margins"] == row["result"]["margins"]   # what the records hold
    assert not list((tmp_path / "store").rglob("*.tmp"))


def test_a_row_that_cannot_be_written_says_why_and_leaves_no_temporary_file(tmp_path, capsys):
    store = BaselineStore(tmp_path / "store")
    parts = {"item": 2}
    key = key_of(parts)
    store._path(key).mkdir(parents=True)        # where the row goes, a folder: the rename fails
    assert store.put(key, parts, {"tokens": [1], "margins": [0.1]}, {}) is False
    err = capsys.readouterr().err
    assert str(store._path(key)) in err and "Is a directory" in err
    assert not [p for p in (tmp_path / "store").rglob("*") if p.name.endswith(".tmp")]


# ----------------------------------------------------------------------------- speed sample


def works(sizes: dict, categories=("a", "b")) -> list:
    out = []
    for suite, n in sizes.items():
        s = SimpleNamespace(name=suite)
        for i in range(n):
            out.append(SimpleNamespace(suite=s, item=SimpleNamespace(id=f"{suite}{i}", categories=[categories[i % 2]]),
                                       temperature=0.0, seed=0))
    return out


def test_speed_sample_is_stratified_over_suites_and_categories_and_seeded():
    from harness.run.speed_sample import choose
    pop = works({"factual": 200, "code": 60, "refusal": 4})
    picked = choose(pop, 30, seed=1)
    by_suite = {s: sum(1 for k in picked if k[0] == s) for s in ("factual", "code", "refusal")}
    assert sum(by_suite.values()) == 30
    assert by_suite == {"factual": 22, "code": 7, "refusal": 1}                # in proportion, each covered
    cats = [int(k[1][len("factual"):]) % 2 for k in picked if k[0] == "factual"]
    assert cats.count(0) == cats.count(1) == 11                              # categories too
    assert choose(pop, 30, seed=1) == picked
    assert choose(pop, 30, seed=2) != picked                                 # not always the same items
    assert len(choose(pop, 10_000, seed=1)) == len(pop)
    assert choose(pop, 0, seed=1) == set()
    # A budget smaller than the suites still covers every one of them.
    assert {k[0] for k in choose(pop, 2, seed=3)} == {"factual", "code", "refusal"}


def test_a_retimed_row_differs_only_beyond_a_near_tie():
    from harness.run.reuse import retime_difference
    stored = {"tokens": [1, 2, 3, 4], "margins": [2.0, 1e-6, 0.8, 0.5]}
    assert retime_difference(stored, {"tokens": [1, 2, 3, 4]}, 1e-3) is None
    assert retime_difference(stored, {"tokens": [1, 9, 9]}, 1e-3) is None      # a near-tie flip at token 1
    why = retime_difference(stored, {"tokens": [1, 2, 7, 4]}, 1e-3)
    assert why and "token 2" in why and "0.8" in why
    assert retime_difference({"tokens": [1], "margins": [None]}, {"tokens": [2]}, 1e-3)   # unknown margin: differs
    assert retime_difference(stored, {"tokens": [1, 2, 3]}, 1e-3)               # shorter: differs at its end


def test_sweep_throughput_ratio_compares_the_same_items(tmp_path):
    """The baseline timed on 2 sampled items (the other 4 reused from the store), the candidate on
    all 6: the ratio must be taken on those 2 items on both sides, not all 6 against 2."""
    from harness.config import load_config
    from harness.run.sweep import sweep_table
    suite = tmp_path / "mini.jsonl"
    suite.write_text(json.dumps({"suite": "mini", "version": "1", "smoke": ["i0"], "defaults": {"grader": "contains"}})
                     + "\n" + "".join(json.dumps({"id": f"i{i}", "prompt": "p", "references": ["x"]}) + "\n"
                                      for i in range(6)))
    cfg = tmp_path / "e.toml"
    cfg.write_text(f"""target = "tiny-llama"
[engines.a]
launch = "srv --port {{port}}"
[engines.b]
launch = "srv --port {{port}} --fast"
[baseline]
name = "base"
decoder = "llama.cpp"
options = {{ engine = "a" }}
[[candidates]]
name = "cand"
decoder = "llama.cpp"
options = {{ engine = "b" }}
[suites.mini]
path = "{suite}"
[profiles.smoke]
suites = ["mini"]
concurrency = [2]
""")
    config = load_config(cfg, "smoke")

    def row(cand, i, wall=None, end=None, block=None, **extra):
        r = {"candidate": cand, "suite": "mini", "item_id": f"i{i}", "seed": 0, "temperature": 0.0,
             "tokens": [1] * 10, "timing": {"wall_s": wall or 1.0, "ttft_s": 0.1, "token_times_s": []}, **extra}
        if end is not None:
            r.update(block=block, finished_at=end)
        return r
    records = [row("base@c2", i, 1.0, 1.0, 0, speed_sample=True) for i in (0, 1)]
    records += [row("base@c2", i, reused={"run_uid": "old"}) for i in range(2, 6)]
    records += [row("cand@c2", i, 0.5, 0.5, 0) for i in (0, 1)]                        # 2x on the sample
    records += [row("cand@c2", i, 4.0, 10.0 + 10 * (i // 4), 1 + i // 4) for i in range(2, 6)]   # slow elsewhere
    (line,) = [r for r in sweep_table(config, {"candidates": {}}, records) if r["candidate"] == "cand"]
    assert line["throughput_n"] == 2 and line["n"] == 6
    assert line["throughput_ratio"] == pytest.approx(2.0)
