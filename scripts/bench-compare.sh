#!/usr/bin/env bash
# Old decoders against new (issue 26), on a quiet machine: three `decodegate bench` runs, one thread.
#
#   old: DECODEGATE_LAYOUT=0, transformers' weight layout and modules for every step (the decoders
#        before the CPU layout and the lean step), with --compare-old adding the rows `...@dynamic`
#        on transformers' growing DynamicCache (the decoders before the preallocated cache);
#   mkl: DECODEGATE_PANEL=0, the layout and the lean one-token step with torch's products (MKL
#        for one row, every block of tokens through transformers);
#   new: the default (decoders/layout.py, decoders/lean.py and decoders/panel.py on a CPU).
# Every ratio is measured inside one run (interleaved rounds after a warm-up); the two runs are
# printed side by side: standard_over_roofline (<= 1.5), verify_k1_in_steps (<= 1.2),
# greedy_lookup_over_theory (>= 0.8), spec[D] over hf-assisted[D] T=... (>= 1).
#
#   scripts/bench-compare.sh [extra bench options]      e.g. --rounds 3 --draft prompt-lookup
# JSON in ${OUT:-bench-compare}-old.json, -mkl.json and -new.json. Defaults: smollm2-135m, drafts
# prompt-lookup, smollm2-135m-int8 and self:12, K=4, greedy and T=0.7, 2 rounds, 64 new tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-bench-compare}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DECODEGATE_LAYOUT=0 "$PY" -m harness.cli bench --compare-old --profile-round --thresholds "" --out "$OUT-old.json" "$@"
DECODEGATE_PANEL=0 "$PY" -m harness.cli bench --profile-round --thresholds "" --out "$OUT-mkl.json" "$@"
"$PY" -m harness.cli bench --profile-round --thresholds "" --out "$OUT-new.json" "$@"
"$PY" - "$OUT-old.json" "$OUT-mkl.json" "$OUT-new.json" <<'EOF'
import json, sys
old, mkl, new = (json.load(open(p)) for p in sys.argv[1:4])
print("\ngoal                                                     old (cache=dynamic)  old (preallocated)  mkl   new")
for name, row in new["goals"].items():
    o, m = old["goals"].get(name, {}), mkl["goals"].get(name, {})
    cell = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"
    print(f"{name:56s} {cell(o.get('old')):20s} {cell(o.get('new')):19s} {cell(m.get('new')):5s} {cell(row.get('new'))}")
for label, prof in (("old", old), ("mkl", mkl), ("new", new)):
    p = prof.get("step_profile", {}).get("standard")
    if p:
        print(f"\nstandard's step, {label}:", json.dumps(p)[:600])
EOF
echo "bench-compare.sh: JSON in $OUT-old.json, $OUT-mkl.json and $OUT-new.json"
