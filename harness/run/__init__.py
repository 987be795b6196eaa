"""The run and its record store: the lineup of decoders and engines, the work plan, records.jsonl
(append-only, resumable), the baseline store reused across runs, and the copy in MLflow."""
