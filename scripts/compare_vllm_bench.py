"""decodegate load rows (load.jsonl, the baseline) vs `vllm bench serve --save-result --save-detailed`: TTFT, TPOT, ITL, E2E p50/p90 in ms.

    python scripts/compare_vllm_bench.py RUN/load.jsonl bench.json
"""
import json
import sys

import numpy as np

rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("candidate") == "vllm" and r.get("ttft_s") is not None]
b = json.load(open(sys.argv[2]))
ttft = [r["ttft_s"] * 1e3 for r in rows]
e2e = [r["e2e_s"] * 1e3 for r in rows]
tpot = [(r["e2e_s"] - r["ttft_s"]) * 1e3 / (len(r["token_times_s"]) - 1) for r in rows if len(r["token_times_s"]) > 1]
itl = [t * 1e3 for r in rows for t in r["token_times_s"][1:]]
out = {}
for name, mine, theirs in (("TTFT", ttft, [x * 1e3 for x in b["ttfts"]]),
                           ("TPOT", tpot, None), ("ITL", itl, [x * 1e3 for xs in b["itls"] for x in xs]), ("E2E", e2e, None)):
    out[name] = {"decodegate": [round(float(np.percentile(mine, q)), 1) for q in (50, 90)], "n": len(mine)}
    if theirs:
        out[name]["vllm_bench"] = [round(float(np.percentile(theirs, q)), 1) for q in (50, 90)]
for k in ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms", "median_itl_ms", "p90_itl_ms", "median_e2el_ms", "p90_e2el_ms", "completed"):
    out.setdefault("vllm_bench_summary", {})[k] = b.get(k)
print(json.dumps(out, indent=1))
