#!/usr/bin/env bash
# The CUDA path, measured (issue 26): on one GPU, in bf16 and fp32, for smollm2-135m,
#   1. scripts/gpu_check.py: every exact decoder (standard on the old cache, hf, speculative with
#      prompt lookup and the self-draft, early exit at threshold 1) against standard;
#   2. the margin noise between one-token steps and one batched forward (gpu_check.py's
#      "margin_noise": its suggested_epsilon is what the near-tie epsilon should be there);
#   3. `decodegate bench` for standard, prompt lookup, the self-draft and transformers' peers,
#      with the old cache beside the new one and the step profile;
#   4. the real-model identity tests of tests/test_foundation.py (standard vs transformers' greedy).
# Everything lands in $OUT (default ./gpu-check-out), one file per step. The steps run in the order
# of what they are worth, each under what is left of --budget seconds (default 540), so a
# time-boxed lease returns every step that finished; a step cut short says so and fails the check.
# --short cuts prompts, tokens and rounds for a check of the script itself (e.g. --device cpu).
#
#   scripts/gpu-check.sh [--device cuda|cpu] [--short] [--out DIR] [--budget SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
SHORT=0
BUDGET=540
OUT=${OUT:-gpu-check-out}
TARGET=${TARGET:-smollm2-135m}   # TARGET=tiny-llama SELF=2: a quick run of the script itself
SELF=${SELF:-12}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --short) SHORT=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "gpu-check.sh: unknown argument $1 (use --device cuda|cpu, --short, --out DIR, --budget S)" >&2
       exit 2 ;;
  esac
done
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"

if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-check.sh: CUDA is not available here (use --device cpu to check the script itself)" >&2
  exit 2
fi
if [ "$SHORT" = 1 ]; then
  PROMPTS=2; NEW=12; ROUNDS=1; BENCH_NEW=16; PPC=1
else
  PROMPTS=6; NEW=64; ROUNDS=2; BENCH_NEW=64; PPC=1
fi
DTYPES=${DTYPES:-"bf16 fp32"}

status=0
START=$(date +%s)
# Runs one step under what is left of the budget; a step cut short or failed fails the check.
step() {
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ "$left" -lt 10 ]; then echo "  skipped: the budget of ${BUDGET} s is spent" >&2; status=1; return 0; fi
  local rc=0
  timeout --kill-after=5 "$left" "$@" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "  cut short at the budget of ${BUDGET} s" >&2; fi
  if [ "$rc" != 0 ]; then status=1; fi
  return 0
}

summarize() {
  "$PY" - "$1" <<'PYEOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"  no result in {sys.argv[1]}: {e}")
print(f"  {r.get('gpu', r['device'])} {r['dtype']} torch {r['torch']}: identity with standard: {r['identity']}")
n = r["margin_noise"]
print(f"  margin noise over {n['positions']} positions: |Δmargin| p50/p99/max = "
      + "/".join(f"{x:.3g}" for x in n["margin_diff_quantiles_p50_p99_max"])
      + f", argmax flips {n['argmax_flips']}; suggested epsilon {n['suggested_epsilon']:.3g}")
for d in r["divergences"]:
    print(f"  divergence: {d}")
PYEOF
}

for DT in $DTYPES; do
  echo "== 1-2. exact decoders and margin noise: $DEVICE $DT"
  step "$PY" scripts/gpu_check.py --device "$DEVICE" --dtype "$DT" --target "$TARGET" --self-layers "$SELF" \
    --prompts "$PROMPTS" --new "$NEW" --out "$OUT/identity-$DT.json"
  summarize "$OUT/identity-$DT.json" || status=1
done

for DT in $DTYPES; do
  echo "== 3. bench: $DEVICE $DT (rounds $ROUNDS)"
  step "$PY" -m harness.cli bench --device "$DEVICE" --dtype "$DT" --target "$TARGET" \
    --draft "prompt-lookup,self:$SELF" --thresholds "" \
    --rounds "$ROUNDS" --max-new-tokens "$BENCH_NEW" --prompts-per-category "$PPC" --temperatures 0,0.7 \
    --compare-old --profile-round --out "$OUT/bench-$DT.json"
  # One round is enough after the first dtype: bf16 is what a GPU runs, fp32 is for the ratios.
  ROUNDS=1
done

echo "== 4. identity tests on the real model ($DEVICE, default dtype)"
# load_model puts the model on CUDA in bf16 when CUDA is present; on --device cpu, fp32.
if [ "$DEVICE" = cuda ]; then VISIBLE=${CUDA_VISIBLE_DEVICES:-0}; else VISIBLE=; fi
step env CUDA_VISIBLE_DEVICES="$VISIBLE" "$PY" -m pytest -q -p no:cacheprovider tests/test_foundation.py \
  -k smollm2 --junitxml "$OUT/pytest-foundation.xml"
echo "gpu-check.sh: results in $OUT (exit $status, $(( $(date +%s) - START )) s)"
exit $status
