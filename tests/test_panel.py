"""The small-M CPU kernel (`decoders.panel`): built on this machine, the products torch computes up
to fp32 rounding, a row's result independent of the rows beside it and of the thread count, a
broken kernel refused, and torch's products where the kernel cannot be built."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from decoders import lean, layout, panel
from harness.models import build_tiny
from tests.numerics import assert_close_scaled

SHAPES = [(64, 96), (37, 19), (576, 960), (1536, 576), (5, 259)]  # (in, out): widths not of 16 too


def _product(x, w, b):
    return panel.linear(x, panel.pack(w), w.shape[1], b)


def test_the_kernel_builds_here():
    # The test machines have a C compiler: a missing kernel here is a failure, not a fallback.
    assert panel.available()


@pytest.mark.parametrize("k,n", SHAPES)
def test_products_equal_torch_up_to_rounding(k, n):
    g = torch.Generator().manual_seed(k * n)
    w, b = torch.randn(k, n, generator=g), torch.randn(n, generator=g)
    for m in (1, 2, 3, 5, 6, 7, 12, panel.MAX_ROWS):
        x = torch.randn(m, k, generator=g)
        ref = x.double() @ w.double() + b.double()
        terms = float((x.abs().double() @ w.abs().double()).max())  # rounding scales with the sum of |terms|
        assert_close_scaled(_product(x, w, b), ref.float(), scale=terms)
        assert_close_scaled(_product(x, w, None), (x.double() @ w.double()).float(), scale=terms)


@pytest.mark.parametrize("k,n", SHAPES)
def test_a_rows_result_does_not_depend_on_the_block(k, n):
    """Every output is one chain of FMAs in k order: a K+1 block's projections are the one-token
    step's, bit for bit, whatever the block size or the thread count."""
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(k, n, generator=g), torch.randn(n, generator=g)
    x = torch.randn(panel.MAX_ROWS, k, generator=g)
    alone = torch.cat([_product(x[i:i + 1], w, b) for i in range(len(x))])
    for m in range(2, panel.MAX_ROWS + 1):
        assert torch.equal(_product(x[:m], w, b), alone[:m]), m
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(_product(x, w, b), alone)
        assert torch.equal(_product(x[:1], w, b), alone[:1])
    finally:
        torch.set_num_threads(threads)


def test_both_one_row_paths_give_the_same_bits():
    """One row streams one panel at a time where a panel is one 512-bit register (AVX-512), two at
    once elsewhere; both must be the same FMA chains, so tokens do not depend on the processor's
    vector width. Both paths are built here, whatever this processor picks."""
    one, two = panel._load(("-DONE_PANEL=1",)), panel._load(("-DONE_PANEL=0",))
    g = torch.Generator().manual_seed(3)
    for k, n in SHAPES:
        w, b = torch.randn(k, n, generator=g), torch.randn(n, generator=g)
        wp = panel.pack(w)
        x = torch.randn(panel.MAX_ROWS, k, generator=g)
        for m in (1, 2, 5, 7, panel.MAX_ROWS):
            for threads in (1, 2):
                y1, y2 = torch.empty(m, n), torch.empty(m, n)
                one(x.data_ptr(), m, k, wp.data_ptr(), n, b.data_ptr(), y1.data_ptr(), threads)
                two(x.data_ptr(), m, k, wp.data_ptr(), n, b.data_ptr(), y2.data_ptr(), threads)
                assert torch.equal(y1, y2), (k, n, m, threads)
                assert torch.equal(y1[:1], _product(x[:1], w, b)), (k, n, m)  # and this machine's own


def test_a_broken_kernel_is_refused():
    """The self-check run before first use fails on a kernel that sums in another order per
    block size, and on one that drops the bias."""
    real = panel.kernel()

    def floats(ptr, count):
        return torch.from_numpy(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (count,)).copy())

    def reordered(x, m, k, wp, n, b, y, threads):  # blocks sum in reverse k order, one row in order
        if m == 1:
            return real(x, m, k, wp, n, b, y, threads)
        xs = floats(x, m * k).view(m, k).flip(1).contiguous()
        pan = floats(wp, -(-n // 16) * k * 16).view(-1, k, 16).flip(1).contiguous()
        real(xs.data_ptr(), m, k, pan.data_ptr(), n, b, y, threads)

    def without_bias(x, m, k, wp, n, b, y, threads):
        real(x, m, k, wp, n, None, y, threads)

    for bad in (reordered, without_bias):
        with pytest.raises(RuntimeError):
            panel._self_check(bad)
    panel._self_check(real)


@pytest.mark.parametrize("broken", ["compiler", "cache folder"])
def test_without_a_compiler_the_products_are_torchs(monkeypatch, tmp_path, broken):
    monkeypatch.setattr(panel, "_LIB", [])
    monkeypatch.setenv("DECODEGATE_CACHE", str(tmp_path))
    if broken == "compiler":
        monkeypatch.setenv("CC", "false")  # a compiler that fails every build
    else:
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("DECODEGATE_CACHE", str(tmp_path / "file"))  # no folder can be made there
    with pytest.warns(RuntimeWarning, match="small-M CPU kernel is off"):
        assert not panel.available()
    loaded = build_tiny("llama")
    step = lean.runner(loaded.model)
    assert layout.fused_weights(loaded.model) is not None and step is not None
    assert not step.multi  # blocks go through transformers
    assert all(m._panels is None for m in loaded.model.modules() if type(m) is layout.FastLinear)
    monkeypatch.setattr(panel, "_LIB", [])
    monkeypatch.setenv("DECODEGATE_PANEL", "0")
    assert not panel.available()


def test_the_profiler_sees_the_kernel_as_an_operator():
    """`bench --profile-round` counts operator time per part; the kernel is no torch operator, so
    without its own event its time would read as Python overhead (81% of a step, once)."""
    from torch.profiler import ProfilerActivity, profile

    from decoders.scopes import profiling_scopes, scope
    w = torch.randn(576, 3072)
    panels, x = panel.pack(w), torch.randn(5, 576)
    with profiling_scopes(), profile(activities=[ProfilerActivity.CPU]) as prof:
        with scope("mlp"):
            panel.linear(x, panels, 3072)
    events = [e for e in prof.events() if e.name == "panel_linear"]
    assert len(events) == 1 and events[0].cpu_parent is not None and events[0].cpu_parent.name == "mlp"


def test_the_arena_is_huge_page_aligned_and_bounded():
    arena = panel.Arena(3 * panel.HUGE_PAGE // 4 + 5)
    assert arena.buffer.data_ptr() % panel.HUGE_PAGE == 0
    w = torch.randn(19, 37)
    a = panel.pack(w, arena)
    assert torch.equal(a, panel.pack(w)) and a.data_ptr() == arena.buffer.data_ptr()
    b = panel.pack(w, arena)
    assert b.data_ptr() == a.data_ptr() + a.numel() * 4  # packed one after the other
    with pytest.raises(ValueError):
        arena.take(arena.buffer.numel())
    # a laid-out model keeps all its panels in one arena
    loaded = build_tiny("llama")
    ptrs = sorted(m._panels.data_ptr() for m in loaded.model.modules() if type(m) is layout.FastLinear)
    span = ptrs[-1] - ptrs[0]
    total = sum(m._panels.numel() * 4 for m in loaded.model.modules() if type(m) is layout.FastLinear)
    assert span < total
