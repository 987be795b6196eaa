"""decodegate's load rows against `vllm bench serve --save-result --save-detailed` on the same
server: TTFT, TPOT, ITL and E2E p50/p90 in ms, each computed the same way from each tool's
per-request times (TPOT: (E2E - TTFT) / (tokens - 1) per request), and decodegate's p50 over
vLLM's per metric.

    python scripts/compare_vllm_bench.py RUN/load.jsonl bench.json [DECODER]

DECODER: the load rows' candidate (default `vllm`, the baseline of regress-vllm.toml).
"""
import json
import sys

import numpy as np


def per_request(ttft_s, e2e_s, itls_s) -> dict:
    """ms lists: TTFT, TPOT, ITL, E2E over the requests (TPOT only where 2+ tokens came)."""
    tpot = [(e - t) / len(i) for t, e, i in zip(ttft_s, e2e_s, itls_s) if len(i)]
    return {"TTFT": [t * 1e3 for t in ttft_s], "TPOT": [x * 1e3 for x in tpot],
            "ITL": [x * 1e3 for i in itls_s for x in i], "E2E": [e * 1e3 for e in e2e_s]}


def compare(load_rows: list[dict], bench: dict, decoder: str = "vllm") -> dict:
    rows = [r for r in load_rows if r.get("candidate") == decoder and r.get("ttft_s") is not None]
    mine = per_request([r["ttft_s"] for r in rows], [r["e2e_s"] for r in rows],
                       [r["token_times_s"][1:] for r in rows])
    ok = [i for i, e in enumerate(bench.get("errors") or [""] * len(bench["ttfts"])) if not e]
    theirs = per_request([bench["ttfts"][i] for i in ok], [bench["latencies"][i] for i in ok],
                         [bench["itls"][i] for i in ok])
    out = {"requests": {"decodegate": len(rows), "vllm_bench": len(ok)}}
    for name in mine:
        a, b = (np.percentile(x, (50, 90)) for x in (mine[name], theirs[name]))
        out[name] = {"decodegate": [round(float(v), 1) for v in a], "vllm_bench": [round(float(v), 1) for v in b],
                     "p50_ratio": round(float(a[0] / b[0]), 3)}
    return out


if __name__ == "__main__":
    load = [json.loads(line) for line in open(sys.argv[1])]
    print(json.dumps(compare(load, json.load(open(sys.argv[2])), *sys.argv[3:4]), indent=1))
