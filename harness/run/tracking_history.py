"""Trends across regress runs, read back from MLflow (`decodegate history`).

A tracking module (it imports mlflow). Each candidate run carries `category.<name>.<quantity>`
metrics (harness.run.tracking_views.category_metrics: identity, speedup, alpha, tau, mean exit
layers, per category and ALL), its verdict, and the content fingerprints of its target and of the
baseline's. Rows come back newest first; a row whose fingerprints differ from the newest run of
the same candidate is marked `other_target` (re-check after a tokenizer or fine-tuning change).
"""
from __future__ import annotations

from harness.run.tracking_uri import check_health, resolve_uri

QUANTITIES = ("alpha", "tau", "speedup", "identity", "mean_exit_layers", "n")


def history(uri: str | None, experiment: str, last: int = 10, candidates: tuple[str, ...] = ()) -> list[dict]:
    """Per regress run (the last `last` parents), candidate and category: the quantities above."""
    from harness.run.tracking import _client, active_experiment
    uri = resolve_uri(uri)
    check_health(uri)
    client = _client(uri)
    exp = active_experiment(client, experiment, uri)  # a deleted one is named, not "no runs"
    if exp is None:
        return []
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`optimization` = 'baseline'",
                                 order_by=["attributes.start_time DESC"], max_results=max(1, last))
    out = []
    newest: dict = {}
    for parent in parents:  # newest first
        children = client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
            max_results=1000)
        for child in sorted(children, key=lambda r: r.info.run_name or ""):
            tags, metrics = child.data.tags, child.data.metrics
            name = tags.get("decodegate.candidate", child.info.run_name)
            if candidates and name not in candidates:
                continue
            fp = (tags.get("decodegate.target_fingerprint"), tags.get("decodegate.baseline_fingerprint"))
            newest.setdefault(name, fp)
            cats: dict = {}
            for key, value in metrics.items():
                if key.startswith("category."):
                    cat, _, q = key[len("category."):].rpartition(".")
                    if q in QUANTITIES:
                        cats.setdefault(cat, {})[q] = value
            for cat in sorted(cats, key=lambda c: (c != "ALL", c)):
                out.append({"run_id": parent.info.run_id, "run_name": parent.info.run_name,
                            "start_time": parent.info.start_time, "candidate": name, "category": cat,
                            "verdict": tags.get("decodegate.verdict"), "target_fingerprint": fp[0],
                            "baseline_fingerprint": fp[1], "other_target": fp != newest[name], **cats[cat]})
    return out
