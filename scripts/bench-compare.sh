#!/usr/bin/env bash
# Old decoders against new, in ONE interleaved `decodegate bench` run (issue 26), on a quiet machine.
#
# "Old" is every in-process decoder on transformers' growing DynamicCache (cache="dynamic", the
# cache they all used before), labelled `...@dynamic`; "new" is the preallocated cache with
# rollback as a length change (the default); `standard[compiled]` adds the torch.compile'd step.
# All of them, and transformers' own peers, run interleaved in the same rounds after a warm-up.
# Printed at the end: the goals of issue 26, old and new side by side:
#   standard_over_roofline (<= 1.5), verify_k1_in_steps (<= 1.2),
#   greedy_lookup_over_theory (>= 0.8), spec[D] over hf-assisted[D] T=... (>= 1),
# then the step profile (fractions of a step) of every in-process decoder.
#
#   scripts/bench-compare.sh [extra bench options]      e.g. --rounds 3 --no-compile
# The JSON goes to ${OUT:-bench-compare.json}. Defaults: smollm2-135m, drafts prompt-lookup,
# smollm2-135m-int8 and self:12, K=4, greedy and T=0.7, 2 rounds, 64 new tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-bench-compare.json}
COMPILE=--compile
ARGS=()
for a in "$@"; do
  if [ "$a" = --no-compile ]; then COMPILE=""; else ARGS+=("$a"); fi
done
export HF_HUB_OFFLINE=1
"$PY" -m harness.cli bench --compare-old --profile-round $COMPILE --thresholds "" --out "$OUT" "${ARGS[@]}"
echo "bench-compare.sh: JSON in $OUT"
