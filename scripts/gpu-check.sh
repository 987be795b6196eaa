#!/usr/bin/env bash
# The CUDA path, measured (issue 26): on one GPU, in bf16 and fp32, for smollm2-135m,
#   1. the real-model identity tests of tests/test_foundation.py (standard vs transformers' greedy),
#      and scripts/gpu_check.py: every exact decoder (standard on the old cache, hf, speculative
#      with prompt lookup and the self-draft, early exit at threshold 1) against standard;
#   2. the margin noise between one-token steps and one batched forward (gpu_check.py's
#      "margin_noise": its suggested_epsilon is what the near-tie epsilon should be there);
#   3. `decodegate bench` for standard, prompt lookup, the self-draft and transformers' peers,
#      with the old cache beside the new one and the step profile.
# Everything lands in $OUT (default ./gpu-check-out). Under 10 minutes on one GPU; --short
# cuts prompts, tokens and rounds for a check of the script itself (e.g. --device cpu).
#
#   scripts/gpu-check.sh [--device cuda|cpu] [--short] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
SHORT=0
OUT=${OUT:-gpu-check-out}
TARGET=${TARGET:-smollm2-135m}   # TARGET=tiny-llama SELF=2: a quick run of the script itself
SELF=${SELF:-12}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --short) SHORT=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "gpu-check.sh: unknown argument $1 (use --device cuda|cpu, --short, --out DIR)" >&2; exit 2 ;;
  esac
done
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1
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
# fp32 only where it is worth it on a CPU: bf16 there is ~7x slower (DESIGN.md), so --device cpu
# checks bf16 on the short setting only.
DTYPES="bf16 fp32"

status=0
echo "== 1. identity tests on the real model ($DEVICE, default dtype)"
# load_model puts the model on CUDA in bf16 when CUDA is present; on --device cpu, fp32.
if [ "$DEVICE" = cuda ]; then
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} "$PY" -m pytest -q -p no:cacheprovider tests/test_foundation.py \
    -k smollm2 2>&1 | tee "$OUT/pytest-foundation.txt" || status=1
else
  CUDA_VISIBLE_DEVICES= "$PY" -m pytest -q -p no:cacheprovider tests/test_foundation.py -k smollm2 2>&1 \
    | tee "$OUT/pytest-foundation.txt" || status=1
fi

for DT in $DTYPES; do
  echo "== 1-2. exact decoders and margin noise: $DEVICE $DT"
  "$PY" scripts/gpu_check.py --device "$DEVICE" --dtype "$DT" --target "$TARGET" --self-layers "$SELF" \
    --prompts "$PROMPTS" --new "$NEW" \
    > "$OUT/identity-$DT.json" || status=1
  "$PY" - "$OUT/identity-$DT.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  identity with standard: {r['identity']}")
n = r["margin_noise"]
print(f"  margin noise over {n['positions']} positions: |Δmargin| p50/p99/max = "
      + "/".join(f"{x:.3g}" for x in n["margin_diff_quantiles_p50_p99_max"])
      + f", argmax flips {n['argmax_flips']}; suggested epsilon {n['suggested_epsilon']:.3g}")
for d in r["divergences"]:
    print(f"  divergence: {d}")
EOF
done

for DT in $DTYPES; do
  echo "== 3. bench: $DEVICE $DT"
  "$PY" -m harness.cli bench --device "$DEVICE" --dtype "$DT" --target "$TARGET" --draft "prompt-lookup,self:$SELF" \
    --thresholds "" \
    --rounds "$ROUNDS" --max-new-tokens "$BENCH_NEW" --prompts-per-category "$PPC" --temperatures 0,0.7 \
    --compare-old --profile-round --out "$OUT/bench-$DT.json" | tee "$OUT/bench-$DT.txt" || status=1
done
echo "gpu-check.sh: results in $OUT (exit $status)"
exit $status
