"""The sandbox that runs untrusted code (generated completions and their tests): its own package
because it is the security boundary. README.md here has the threat model, the layers and what
remains possible.

- `parent`: what the harness calls (`run_code`, `SandboxLimits`, `isolation_available`); it starts
  the sandboxed interpreter and reads the verdict.
- `child`: the preamble that confines each sandboxed process (namespaces, Landlock, rlimits,
  cgroup, seccomp) before anything untrusted runs. Never imported by the harness.
- `wire`: the protocol between the candidate's process and the tests' process. Never imported.
- `filter`: the seccomp allow-list, built with libseccomp (pyseccomp). Never imported by the harness.
- `denylist`: the hand-encoded BPF deny-list, the fallback where libseccomp is missing. Never
  imported by the harness.
"""
from suites.sandbox.parent import (SandboxLimits, SandboxResult, free_names, isolation_available,  # noqa: F401
                                   run_code)
