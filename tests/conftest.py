"""Shared fixtures: tiny random models (built once per session), the real default model, a
baseline store per module and per test, and a real MLflow server (plain helpers: helpers.py)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

import helpers

torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny models gain nothing from threads, and several busy threads on 2 cores slow every
# matmul by orders of magnitude under contention. Subprocesses inherit this too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="module", autouse=True)
def _own_module_baseline_store(tmp_path_factory):
    """Each module its own baseline store, set before the module's own fixtures run: a
    module-scoped fixture that runs `regress` (the real-model runs) would otherwise write to the
    user's store under ~/.cache, and a later `make regress` reuse rows a test made."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DECODEGATE_BASELINE_STORE", str(tmp_path_factory.mktemp("module-baselines")))
        yield


@pytest.fixture(autouse=True)
def _own_baseline_store(tmp_path_factory, monkeypatch):
    """Each test its own baseline store: no test reuses another's baseline by accident (the
    store's own tests point runs at one folder on purpose)."""
    monkeypatch.setenv("DECODEGATE_BASELINE_STORE", str(tmp_path_factory.mktemp("baselines")))


@pytest.fixture
def broken_greedy_verifier(monkeypatch):
    """The speculative decoder's greedy verifier replaced by one that accepts every draft without
    comparing it with the target: the bug an identity gate (and --fail-fast) must catch."""
    import decoders.speculative as spec
    from decoders.verify import Verdict

    def accept_all(choice, draft):  # choice (B, K+1): the target's argmax per row
        k = draft.shape[1]
        return Verdict(accepted=draft.new_full((draft.shape[0],), k), token=choice[:, k])

    monkeypatch.setattr(spec, "keep_until_mismatch", accept_all)


@pytest.fixture
def mlflow_server(tmp_path):
    """A real `mlflow server` of this test's own (sqlite in tmp_path, a free port): its URI."""
    with helpers.mlflow_server(tmp_path) as uri:
        yield uri


@pytest.fixture(scope="session")
def _mlflow_db_template(tmp_path_factory):
    """An empty MLflow sqlite store, its tables made once per test process: MLflow builds a new
    store by running its schema migrations (seconds of CPU each time, tens of seconds on a loaded
    2-core machine)."""
    from mlflow import MlflowClient
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_sqlite(tmp_path, _mlflow_db_template):
    """The URI of an MLflow sqlite store of this test's own (tmp_path/mlflow.db), a copy of the
    session's empty one: the same store a first run would create, without the migrations."""
    shutil.copyfile(_mlflow_db_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="session")
def tiny_llama():
    from harness.models import load_model
    return load_model("tiny-llama")


@pytest.fixture(scope="session")
def tiny_qwen2():
    from harness.models import load_model
    return load_model("tiny-qwen2")


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-qwen2"])
def tiny_model(request):
    from harness.models import load_model
    return load_model(request.param)


@pytest.fixture(scope="session")
def llama_server():
    """The llama-server binary, proven once per test process: started on the embedded model for
    four tokens (harness.selfcheck). Every test that runs a real llama.cpp asks for this fixture,
    so a build that cannot run here (SIGILL on a CPU it was not built for, a crash, a hang) fails
    each of them with this one message instead of a cascade of unrelated asserts. No skip: the
    engine tests run on every machine CI uses."""
    from harness.selfcheck import cached_llama_server_proof
    problem = cached_llama_server_proof()
    if problem:
        pytest.fail(f"llama.cpp cannot run on this machine: {problem}", pytrace=False)
    from harness.run.engines import llama_tool
    return llama_tool("llama-server")


@pytest.fixture(scope="session")
def smollm2():
    from harness.models import load_model
    return load_model("smollm2-135m")


# The longest files first, so that `make test`'s workers (pytest-xdist, --dist loadfile with
# --no-loadscope-reorder) start them at once and the short ones fill in around them: otherwise
# xdist sends the files with the most tests first and a 2-test file of several minutes starts
# last, alone on one core (a whole run ended with one worker idle for 20 minutes that way).
# Seconds of test time per file on a 2-core AMD EPYC without AVX-512: quiet figures from `make test`
# after f11f2a5, loaded ones (load average about 5) from a fresh clone of 2026-12-06 (the first ones
# start together, one per worker, so their order among them does not matter).
LONG_FIRST = (
    "test_exactness_int8.py",            # ~200 s quiet, ~790 s at load 5 (2026-12-06): real smollm2 + int8 draft, two regress runs
    "test_vllm.py",                      # ~370-420 s quiet, ~600 s under load: three vLLM servers (~90 s to start), four regress runs
    "test_fault_matrix.py",              # ~415 s at load 5: every fault in every position, profile and role, each a regress
    "test_fault_attacks.py",             # ~320 s at load 5: child regresses a decoder attacks (strict xfails among them)
    "test_watch_engine.py",              # ~300-660 s: a real llama.cpp regress, then watch runs
    "test_engine_sampled_reference.py",  # ~185-300 s
    "test_engine_sampled.py",            # ~195-280 s: five real llama.cpp candidates, three seeds
    "test_engines.py",                   # ~130-245 s
    "test_sandbox_unprivileged.py",      # ~200 s at load 5: the sandbox tests again as uid 65534
    "test_watch_vllm.py",                # ~160 s + its server's start: a real vLLM n-gram server and watch
    "test_review_mlflow.py",             # ~80-155 s
    "test_regress.py",                   # ~105-135 s
    "test_baseline_reuse.py",            # ~65-120 s
    "test_load_engine.py",               # ~100-115 s
    "test_exactness_gates.py",           # ~65-100 s
    "test_engine_reuse.py",              # ~55-95 s
    "test_compiled_step.py",             # ~60-80 s
)


# What makes a test `full` (left out of `make check`): a real engine server, a real-model run of
# smollm2-135m, or the sandbox's escape catalogue. Tests say so with @pytest.mark.full; these
# fixtures and the older `slow` mark say it for them.
FULL_FIXTURES = ("llama_server", "smollm2")
# Files that are all real-component time, not logic `make check` needs: a real MLflow server and
# its views (~80 s), torch.compile of two models (~60 s).
FULL_FILES = ("test_review_mlflow.py", "test_compiled_step.py")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("slow") or item.path.name in FULL_FILES \
                or any(f in getattr(item, "fixturenames", ()) for f in FULL_FIXTURES):
            item.add_marker(pytest.mark.full)

    def rank(item):
        name = item.path.name
        return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)
    items.sort(key=rank)  # stable: the order within a file, and among the rest, is kept


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module: tiny models are all Python overhead, and a second thread
    only adds contention on shared CPUs (and xdist already runs one worker per core)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
