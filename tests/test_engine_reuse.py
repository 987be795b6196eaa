"""The baseline store with a real llama.cpp server (issue 21): an engine row is reused only where its
key still says what produced it, and the baseline's store misses run in whole blocks.

Each test runs `decodegate regress` in-process, twice or more, against its own store folder.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from decoders.engines.server import EngineServer, EngineSpec
from harness.cli import main
from test_engines import PROMPTS, engine_config, launch_args, write_suite

# Every test here runs a real llama.cpp: proven once by conftest's fixture, or failed with its message.
pytestmark = pytest.mark.usefixtures("llama_server")


def regress(cfg: Path, run_dir: Path, store: Path) -> dict:
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-tracking", "--no-progress",
                 "--baseline-store", str(store)])
    assert code in (0, 1), code  # the verdict is the engine's; what the store did is tested here
    return json.loads((run_dir / "summary.json").read_text())


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_engine_rows_regenerate_after_a_client_code_or_launch_env_change(tmp_path, monkeypatch):
    from harness.run import fingerprint
    suite = write_suite(tmp_path)
    store = tmp_path / "store"
    plain = launch_args("-np", "1", "--spec-type", "none")

    def cfg(env: str = "") -> Path:
        c = engine_config(tmp_path, suite, {"plain": plain}, [("aa", "plain")], profile_extra="speed_items = 1")
        if env:
            c.write_text(c.read_text().replace('model = "smollm2-135m"\n', f'model = "smollm2-135m"\nenv = {env}\n', 1))
        return c

    assert regress(cfg(), tmp_path / "r1", store)["baseline_store"]["stored"] == 4
    assert regress(cfg(), tmp_path / "r2", store)["baseline_store"]["reused_rows"] == 3    # the control: reused
    # The client that builds llama.cpp's requests is edited (a sampler setting in completion_body).
    import decoders.engines as engines
    copy = tmp_path / "engines"
    shutil.copytree(Path(engines.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    src = (copy / "llamacpp.py").read_text()
    (copy / "llamacpp.py").write_text(src.replace('"min_p": 0.0', '"min_p": 0.05'))
    with monkeypatch.context() as m:
        m.setattr(fingerprint, "ENGINE_CLIENT_DIR", copy)
        assert regress(cfg(), tmp_path / "r3", store)["baseline_store"]["reused_rows"] == 0
    # A flag set through the launch environment instead of the command line.
    assert regress(cfg('{ LLAMA_ARG_UBATCH = "256" }'), tmp_path / "r4", store)["baseline_store"]["reused_rows"] == 0


def url_config(tmp_path: Path, suite: Path, url: str, opt_in: bool) -> Path:
    cfg = tmp_path / "url.toml"
    cfg.write_text(f"""target = "smollm2-135m"
[engines.running]
base_url = "{url}"
model = "smollm2-135m"
{"reuse_baseline = true" if opt_in else ""}
[baseline]
name = "base"
decoder = "llama.cpp"
options = {{ engine = "running" }}
[[candidates]]
name = "aa"
decoder = "llama.cpp"
kind = "exact"
options = {{ engine = "running" }}
[suites.mini]
path = "{suite}"
[profiles.smoke]
subset = "smoke"
suites = ["mini"]
speed_items = 1
""")
    return cfg


@pytest.mark.slow
def test_a_base_url_engine_is_reused_only_where_the_config_opts_in(tmp_path):
    suite = write_suite(tmp_path)
    store = tmp_path / "store"
    spec = EngineSpec(name="deployed", launch=tuple(launch_args("-np", "1", "--spec-type", "none")),
                      model="smollm2-135m", health_timeout_s=120)
    with EngineServer(spec, log_dir=tmp_path) as server:
        first = regress(url_config(tmp_path, suite, server.base_url, True), tmp_path / "r1", store)
        assert first["baseline_store"]["stored"] == 4
        # Without the opt-in nothing is reused (nor stored): the URL does not say what answers it.
        st = regress(url_config(tmp_path, suite, server.base_url, False), tmp_path / "r2", store)["baseline_store"]
        assert st["reused_rows"] == 0 and st["stored"] == 0
        assert "given by base_url" in st["reuse_refused"] and "reuse_baseline = true" in st["reuse_refused"]
        assert "store rows not reused" in (tmp_path / "r2" / "report.txt").read_text()
        again = regress(url_config(tmp_path, suite, server.base_url, True), tmp_path / "r3", store)
        assert again["baseline_store"]["reused_rows"] == 3


@pytest.mark.slow
def test_engine_store_misses_run_in_whole_blocks(tmp_path):
    suite = write_suite(tmp_path, n=6)
    store = tmp_path / "store"
    cfg = engine_config(tmp_path, suite, {"plain": launch_args("-np", "2", "--spec-type", "none")}, [("aa", "plain")],
                        profile_extra="speed_items = 0\nconcurrency = [2]")
    regress(cfg, tmp_path / "r1", store)
    # One row leaves the store (m4). With speed_items = 0 the store's re-check still generates one
    # stored row again (m0, the first): two rows to generate, of items that sat in different blocks
    # of the first run.
    for f in store.rglob("*.json"):
        if json.loads(f.read_text())["key_parts"]["request"]["messages"][0]["content"] == PROMPTS[4]:
            f.unlink()
    st = regress(cfg, tmp_path / "r2", store)["baseline_store"]
    assert st["reused_rows"] == 4 and st["retimed"] == 1
    fresh = [r for r in records(tmp_path / "r2") if r["candidate"] == "base@c2" and not r.get("reused")]
    assert sorted(r["item_id"] for r in fresh) == ["m0", "m4"]
    # Generated together, two in flight, as the candidates run theirs: not one per block.
    assert fresh[0]["block"] == fresh[1]["block"]
    cand = [r for r in records(tmp_path / "r2") if r["candidate"] == "aa@c2" and r["block"] == fresh[0]["block"]]
    assert sorted(r["item_id"] for r in cand) == ["m0", "m4"]
