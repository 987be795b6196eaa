"""Code that puts a test's own process into one of the sandbox's configurations, shared by the
sandbox's test files (they run it in a child interpreter, as source).

REFUSE_UNSHARE: a kernel that refuses namespaces (an unprivileged container): a seccomp filter
on the whole process makes unshare fail with EPERM, so the sandbox gets no namespaces at all.
`catalogue`: the parameters of a long list of attacks on one layer, all but a fast few marked
`full` (make check keeps one attack per layer; make test runs them all).
"""

import pytest


def catalogue(names, fast):
    """pytest params of `names` (sorted), each not in `fast` marked `full`."""
    assert set(fast) <= set(names), set(fast) - set(names)
    return [pytest.param(name, marks=() if name in fast else pytest.mark.full) for name in sorted(names)]

NUMBERS = {"unshare": {"x86_64": 272, "aarch64": 97},
           "landlock_create_ruleset": {"x86_64": 444, "aarch64": 444}}


def refusing(*names) -> str:
    """Source that makes each call in `names` fail with EPERM for this process and its children
    (a seccomp filter, raw BPF: no library needed)."""
    return f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
prog = [(0x20, 0, 0, 0)]
for nr in {[NUMBERS[name] for name in names]!r}:
    prog += [(0x15, 0, 1, nr[os.uname().machine]), (0x06, 0, 0, 0x00050001)]
prog.append((0x06, 0, 0, 0x7FFF0000))
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(F))]
filters = (F * len(prog))(*[F(*i) for i in prog])
assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(P(len(prog), filters)), 0, 0) == 0
"""


REFUSE_UNSHARE = refusing("unshare")
