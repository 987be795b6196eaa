"""A small-M product for a CPU: y = x W^T + b for 1 to `MAX_ROWS` rows (a decode step, a K+1
verification block), over W packed in panels of 16 columns (`panel.c`, built here on first use).

Why not the libraries: on a 2-core AMD EPYC (AVX2, one thread) all of smollm2-135m's products for
one row take 31-32 ms with MKL over an (in, out) layout, and 5 rows take 62-100 ms (oneDNN
prepacked, MKL): their small-M kernels stream the weights once per few rows, or stall on them.
`panel.c` streams every panel once for up to 6 rows, with the FMAs over the rows hidden under the
memory traffic: 25.5-28 ms for one row, 34-37 ms for five, and 23.8 / 30.5 ms with the panels
on huge pages (`Arena`; measured side by side in one process).

Each output is one chain of fused multiply-adds in k order, so a row's result is the same bits
whether it is computed alone or in a block: a K+1 verification's projections equal the one-token
steps' (the attention between them still differs in rounding).

The library is compiled with the system's C compiler (`$CC`, else `cc`) for this processor
(-march=native) into decodegate's cache folder, keyed by the source, the flags and the CPU's
feature flags, and checked against torch before first use. Where there is no compiler, the build
or the check fails, or `DECODEGATE_PANEL=0`, `available()` is False and callers use torch's own
products (the previous path).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from decoders.scopes import scope

NB = 16          # columns per panel (two AVX2 registers)
MAX_ROWS = 16    # above this many rows torch's GEMM is faster (measured: crossover at ~24 rows)
SOURCE = Path(__file__).with_name("panel.c")
FLAGS = ("-O3", "-march=native", "-std=c99", "-fPIC", "-shared", "-fopenmp")

_LIB: list = []  # [function or None], filled on first use


def enabled() -> bool:
    return os.environ.get("DECODEGATE_PANEL", "1") != "0"


def _cache_dir() -> Path:
    # the same folder as harness.models.cache_dir (decoders does not import harness)
    root = os.environ.get("DECODEGATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "decodegate")
    return Path(root) / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _build(compiler: str, defines: tuple[str, ...] = ()) -> Path:
    src = SOURCE.read_bytes()
    flags = FLAGS + defines
    key = hashlib.sha256(src + " ".join((compiler,) + flags).encode() + _cpu_flags().encode()).hexdigest()[:16]
    out = _cache_dir() / f"panel-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name and renamed: parallel test workers may build at the same time.
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so")
    os.close(fd)
    try:
        for flags in (flags, tuple(f for f in flags if f != "-fopenmp")):  # without OpenMP where the compiler has none
            done = subprocess.run([compiler, *flags, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                                  timeout=300)
            if done.returncode == 0:
                os.replace(tmp, out)
                return out
        raise RuntimeError(done.stderr.strip()[-500:])
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(defines: tuple[str, ...] = ()):
    """The compiled `panel_linear`; `defines` (-DNAME=VALUE) pick a code path, for the tests."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) found")
    fn = ctypes.CDLL(str(_build(compiler, defines))).panel_linear
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    fn.restype = None
    return fn


def _self_check(fn) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 19, generator=g)
    b = torch.randn(37, generator=g)
    x = torch.randn(7, 19, generator=g)
    panels = pack(w.t())
    ref = (x.double() @ w.double().t() + b.double()).float()
    for m in (1, 2, 5, 7):
        y = torch.empty(m, 37)
        fn(x.data_ptr(), m, 19, panels.data_ptr(), 37, b.data_ptr(), y.data_ptr(), 1)
        if not torch.allclose(y, ref[:m], rtol=1e-5, atol=1e-5):
            raise RuntimeError(f"panel kernel disagrees with torch for {m} rows")
        if m > 1 and not torch.equal(y[1:2], _one(fn, x[1:2], panels, b)):
            raise RuntimeError("panel kernel: a row's result depends on the rows beside it")


def _one(fn, x, panels, b):
    y = torch.empty(1, 37)
    fn(x.contiguous().data_ptr(), 1, 19, panels.data_ptr(), 37, b.data_ptr(), y.data_ptr(), 1)
    return y


def kernel():
    """The compiled product, or None where it is off or cannot be built (with a warning, once)."""
    if not _LIB:
        fn = None
        if enabled():
            try:
                fn = _load()
                _self_check(fn)
            except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as exc:
                warnings.warn(f"decodegate: the small-M CPU kernel is off ({exc}); using torch's products",
                              RuntimeWarning, stacklevel=2)
                fn = None
        _LIB.append(fn)
    return _LIB[0] if enabled() else None


def available() -> bool:
    return kernel() is not None


HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # Linux


class Arena:
    """One fp32 buffer for many packed weights, on 2 MiB-aligned memory that Linux is asked to
    back with huge pages (transparent huge pages in "madvise" mode, the usual default): the
    kernel's weight stream then crosses no 4 KiB page boundary, where the hardware prefetchers
    stop and the TLB misses. Measured for all of smollm2's products, one thread: one row 25.5 ->
    23.8 ms, five rows 34.3 -> 30.5 ms. Where the call fails (another OS), the memory is plain."""

    def __init__(self, numel: int):
        raw = torch.empty(numel + HUGE_PAGE // 4, dtype=torch.float32)
        start = (-raw.data_ptr()) % HUGE_PAGE // 4
        self.buffer, self.used = raw[start:start + numel], 0
        whole = numel * 4 // HUGE_PAGE * HUGE_PAGE
        if whole and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.madvise(ctypes.c_void_p(self.buffer.data_ptr()), ctypes.c_size_t(whole), MADV_HUGEPAGE)
            except (OSError, AttributeError):
                pass

    def take(self, numel: int) -> torch.Tensor:
        if self.used + numel > self.buffer.numel():
            raise ValueError("arena is full")
        out = self.buffer[self.used:self.used + numel]
        self.used += numel
        return out


def packed_numel(k: int, n: int) -> int:
    return -(-n // NB) * NB * k


def pack(w: torch.Tensor, arena: Arena | None = None) -> torch.Tensor:
    """(in, out) weights -> (ceil(out / 16), in, 16) panels, the last one padded with zeros;
    written into `arena` where one is given."""
    k, n = w.shape
    p = -(-n // NB)
    if n % NB:
        w = F.pad(w, (0, p * NB - n))
    panels = w.reshape(k, p, NB).permute(1, 0, 2)
    if arena is None:
        return panels.contiguous()
    return arena.take(packed_numel(k, n)).view(p, k, NB).copy_(panels)


def linear(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) fp32 on a CPU, at most MAX_ROWS rows -> (..., n); panels from `pack`."""
    k = panels.shape[1]
    flat = x.reshape(-1, k)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    fn = _LIB[0] if _LIB else kernel()
    if fn is None:
        raise RuntimeError("the small-M CPU kernel is not available here (panel.available() is False)")
    y = torch.empty(flat.shape[0], n, dtype=torch.float32)
    with scope("panel_linear"):  # not a torch operator: named so that the profiler counts it as one
        fn(flat.data_ptr(), flat.shape[0], k, panels.data_ptr(), n,
                None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
    return y.view(*x.shape[:-1], n)
