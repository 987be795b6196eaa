"""Shared fixtures: tiny random models (built once per session) and the real default model."""
from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny models gain nothing from threads, and several busy threads on 2 cores slow every
# matmul by orders of magnitude under contention. Subprocesses inherit this too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


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
def smollm2():
    from harness.models import load_model
    return load_model("smollm2-135m")
