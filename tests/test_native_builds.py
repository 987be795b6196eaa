"""Native builds on any x86: a build that traps is named at setup and at launch, in one line.

The trap is real in every test here: a program that executes an instruction this CPU lacks (an
AVX-512 one where there is no AVX-512, else an AMX tile instruction with no tile state granted,
which traps on AMX machines too: the llama.cpp fault the build guards against) dies by SIGILL.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from decoders.engines.server import EngineError, EngineServer, EngineSpec, exit_cause

ROOT = Path(__file__).resolve().parent.parent


def _cpu_flags() -> set[str]:
    line = next((x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def trapping_program(folder: Path) -> Path:
    """A 'server' built for a CPU feature this machine cannot run: it dies by SIGILL at once."""
    insn = "vpaddd %%zmm0, %%zmm0, %%zmm0" if "avx512f" not in _cpu_flags() else "tilezero %%tmm0"
    src = folder / "trap.c"
    src.write_text(f'int main(void) {{ __asm__ volatile("{insn}" ::: "memory"); return 0; }}\n')
    out = folder / "llama-server"
    subprocess.run(["cc", str(src), "-o", str(out)], check=True, capture_output=True)
    return out


def test_a_process_that_traps_is_named_by_its_signal_and_cause(tmp_path):
    prog = trapping_program(tmp_path)
    rc = subprocess.run([str(prog)]).returncode
    assert rc == -4  # SIGILL: the instruction really is missing here
    said = exit_cause(rc)
    assert said.startswith("died from SIGILL") and "CPU feature this machine cannot run" in said
    assert exit_cause(3) == "exited with code 3"
    assert exit_cause(-9).startswith("died from SIGKILL") and "out-of-memory" in said + exit_cause(-9)


def test_an_engine_that_dies_by_sigill_at_launch_raises_an_engine_error_naming_it(tmp_path):
    prog = trapping_program(tmp_path)
    spec = EngineSpec(name="trap", launch=(str(prog), "--port", "{port}"), health_timeout_s=30)
    with pytest.raises(EngineError) as err:
        EngineServer(spec, log_dir=tmp_path).start()
    first = str(err.value).splitlines()[0]
    assert "SIGILL" in first and "CPU feature this machine cannot run" in first and "'trap'" in first


def test_a_broken_server_build_fails_the_setup_check_in_seconds_with_one_line(tmp_path):
    prog = trapping_program(tmp_path)
    env = {"DECODEGATE_LLAMA_SERVER": str(prog), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "harness.selfcheck", "llama-server"], capture_output=True,
                          text=True, env=env, timeout=60, cwd=ROOT)
    assert done.returncode == 1
    line = done.stderr.splitlines()[0]
    assert line.startswith("decodegate setup: FAILED: llama-server") and "SIGILL" in line
    assert "rebuild it" in line


@pytest.mark.full
def test_regress_with_an_engine_that_cannot_start_exits_2_and_leaves_no_run_record(tmp_path):
    prog = trapping_program(tmp_path)
    suite = tmp_path / "mini.jsonl"
    suite.write_text("\n".join(json.dumps(r) for r in [
        {"suite": "mini", "version": "1", "description": "t", "smoke": ["a"],
         "defaults": {"grader": "contains", "max_new_tokens": 4}},
        {"id": "a", "prompt": "hi", "references": ["x"]}]) + "\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'target = "tiny-llama"\n[engines.eng]\nlaunch = ["{prog}", "--port", "{{port}}"]\n'
                   f'health_timeout_s = 30\n[baseline]\nname = "base"\ndecoder = "llama.cpp"\n'
                   f'options = {{ engine = "eng" }}\n[[candidates]]\nname = "std"\ndecoder = "standard"\n'
                   f'kind = "exact"\n[suites.mini]\npath = "{suite}"\n[profiles.smoke]\nsubset = "smoke"\n'
                   f'suites = ["mini"]\n')
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "harness.cli", "regress", "--config", str(cfg), "--run-dir",
                           str(run_dir), "--no-progress"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                             "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    error = [x for x in done.stderr.splitlines() if x.startswith("decodegate: error:")]
    assert len(error) == 1 and "SIGILL" in error[0], done.stderr[-2000:]
    assert not (run_dir / "run.json").exists() and not (run_dir / "summary.json").exists()
    assert (run_dir / "engine-eng.log").exists()  # the log stays, to be read


def _no_amx_flags() -> list[str]:
    text = (ROOT / "cmake" / "llama-server-only.cmake").read_text()
    return re.search(r"set\(DECODEGATE_NO_AMX_FLAGS ([^)]*)\)", text).group(1).split()


def test_the_build_flags_drop_amx_and_keep_avx512_and_vnni_on_an_amx_cpu():
    """What the compiler defines for an AMX CPU (Sapphire Rapids) with the build's flags, put before
    -march as cmake's directory options are: ggml's AMX kernels are compiled only under
    __AMX_INT8__, and must go; the rest of the native ISA must stay."""
    def macros(*flags):
        out = subprocess.run(["cc", *flags, "-dM", "-E", "-"], input="", capture_output=True, text=True, check=True)
        return set(re.findall(r"#define (__\w+__) 1", out.stdout))
    plain, guarded = macros("-march=sapphirerapids"), macros(*_no_amx_flags(), "-march=sapphirerapids")
    assert {"__AMX_INT8__", "__AMX_TILE__"} <= plain  # the compiler would build them
    assert not {m for m in guarded if m.startswith("__AMX")}
    assert {"__AVX512F__", "__AVX512VNNI__", "__AVX512BF16__", "__AVX2__"} <= guarded


@pytest.mark.full
def test_the_built_cpu_backend_holds_no_amx_instruction(llama_server):
    lib = next(Path(llama_server).parent.glob("libggml-cpu.so*"))
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    assert "vfmadd" in dump or "vpdpbusd" in dump or "vpmaddubsw" in dump  # a real SIMD build was read
    assert not re.search(r"\b(tilezero|tileloadd|tdpbssd|tdpbf16ps|ldtilecfg)\b", dump)


@pytest.mark.full
def test_the_setup_check_passes_on_the_real_build(llama_server):
    done = subprocess.run([sys.executable, "-m", "harness.selfcheck"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "llama-server: ok, 4 tokens" in done.stdout and "panel kernel:" in done.stdout
