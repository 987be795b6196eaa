"""Early exit worth evaluating: exit heads trained for the target, thresholds with a guarantee,
and the speed-quality frontier.

- `prompts`: where the training and calibration text comes from (templated prompts, checked
  disjoint from every suite's items; split by hash into train / valid / calib / test).
- `data`: the target's own continuations of those prompts, and its hidden states on them.
- `train`: `decodegate train-exits` (tuned-lens distillation of per-layer exit heads).
- `ltt`: Learn-then-Test, pure statistics (p-values, fixed-sequence testing).
- `calibrate`: `decodegate calibrate-exits` (thresholds, ε, δ, n, held-out checks).
- `frontier`: `decodegate exit-frontier` (threshold sweep against `standard` on graded suites).

The decoders that use the results live in `decoders/` (`exit_heads`, `early_exit`, the
self-draft in `drafters`); nothing there imports this package.
"""
