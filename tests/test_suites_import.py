"""`decodegate suites import`: request logs to a suite file (dedup, categories, stratified sample,
provenance in the header, atomic writes, bad lines named), and `temperatures = "as-logged"`."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness.cli import main
from suites import load_suite


def chat_log(path: Path) -> Path:
    lines = []
    for i in range(30):
        team = "search" if i < 20 else "support"
        req = {"model": "x", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": f"Question {i} from {team}?"}],
               "temperature": 0.7 if i % 3 else 0.0, "max_tokens": 20, "metadata": {"app": {"team": team}}}
        if i % 5 == 0:
            req["top_p"] = 0.9
        lines.append(json.dumps(req))
    lines.insert(5, lines[3])    # an exact duplicate
    lines.insert(9, "")          # blank lines are skipped
    lines.append(json.dumps({"body": {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
                             "custom_id": "batch-1"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_chat_log_to_suite(tmp_path, capsys):
    log = chat_log(tmp_path / "traffic.jsonl")
    out = tmp_path / "suite.jsonl"

    def imp(path, seed=3, *extra):
        return main(["suites", "import", str(log), "--out", str(path), "--name", "traffic", "--sample", "12",
                     "--seed", str(seed), "--category-field", "app.team", *extra])
    assert imp(out) == 0
    assert "wrote" in capsys.readouterr().out
    header = json.loads(out.read_text().splitlines()[0])
    src = header["source"]
    assert src["sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()
    assert src["requests_read"] == 32 and src["duplicates_removed"] == 1 and src["format"] == "chat"
    # 31 unique requests: 20 search, 10 support, 1 without the field; 12 drawn in proportion.
    assert src["sampling"]["seed"] == 3 and src["sampling"]["population"] == 31
    per = src["sampling"]["per_category"]
    assert sum(per.values()) == 12 and per["search"] > per["support"] >= 3 and per["unknown"] == 1
    suite = load_suite(out)
    assert suite.name == "traffic" and len(suite.items) == 12
    by_id = {it.id: it for it in suite.items}
    for item in suite.items:
        assert item.grader == "none"
        line = int(item.id.split("-")[1])
        assert log.read_text().splitlines()[line - 1]  # the id is the source line
    assert any(it.sampling and it.sampling.get("temperature") == 0.7 for it in by_id.values())
    assert all(it.max_new_tokens == 20 for it in suite.items if it.categories != ("unknown",))
    # The same seed gives the same suite; another seed another sample.
    assert imp(tmp_path / "again.jsonl") == 0
    assert load_suite(tmp_path / "again.jsonl").hash == suite.hash
    assert imp(tmp_path / "other.jsonl", 4) == 0
    assert load_suite(tmp_path / "other.jsonl").hash != suite.hash
    # Rewriting a version with other content is refused; a new version is fine.
    assert imp(out, 4) == 2
    assert "new --version" in capsys.readouterr().err
    assert load_suite(out).hash == suite.hash
    assert imp(out, 4, "--version", "2") == 0


def test_prompts_file_with_length_buckets(tmp_path):
    log = tmp_path / "prompts.txt"
    log.write_text("short one\n\n" + "a medium prompt " * 5 + "\nshort one\n" + "long " * 100 + "\n")
    out = tmp_path / "p.jsonl"
    assert main(["suites", "import", str(log), "--out", str(out), "--length-buckets", "20,200"]) == 0
    suite = load_suite(out)
    assert [it.categories for it in suite.items] == [("len<20",), ("len20-200",), ("len>=200",)]
    assert suite.name == "prompts" and all(it.sampling is None for it in suite.items)


def test_bad_lines_are_named_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    for bad, field in [("{not json", "<json>"), (json.dumps({"prompt": "no messages"}), "messages"),
                       (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "lots"}),
                        "max_new_tokens"),
                       # json.loads reads NaN, and NaN passed every range check (then ended the run)
                       ('{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
                        "sampling.temperature': must be a finite number"),
                       (json.dumps({"messages": [{"role": "user", "content": ""}]}), "has no text")]:
        log = tmp_path / "log.jsonl"
        log.write_text(f"{good}\n{good.replace('hi', 'hello')}\n{bad}\n")
        assert main(["suites", "import", str(log), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{log}:3" in err and field in err
        assert not out.exists() and not list(tmp_path.glob(".s.jsonl.*"))  # whole or not at all


def test_as_logged_sampling_reaches_the_requests(tmp_path):
    from harness.run import runner
    from harness.config import load_config
    from harness.models import load_model
    log = chat_log(tmp_path / "traffic.jsonl")
    suite_path = tmp_path / "traffic.jsonl.suite.jsonl"
    assert main(["suites", "import", str(log), "--out", str(suite_path), "--name", "traffic"]) == 0
    cfg = tmp_path / "regress.toml"
    cfg.write_text(f"""
target = "tiny-llama"
top_p = 0.5
log_text = false
[[candidates]]
decoder = "speculative"
options = {{ draft = "prompt-lookup" }}
[suites.traffic]
path = "{suite_path}"
[profiles.smoke]
subset = "full"
suites = ["traffic"]
temperatures = "as-logged"
seeds = [0, 1]
""")
    config = load_config(cfg)
    assert config.profile.as_logged and config.log_text is False
    suite = runner.load_suites(config)[0]
    work = runner.work_items(config, [suite])
    target = load_model("tiny-llama")
    seen = {}
    for w in work:
        req = runner.make_request(config, target, w)
        logged = json.loads(log.read_text().splitlines()[int(w.item.id.split("-")[1]) - 1])
        logged = logged.get("body", logged)
        assert req.temperature == logged.get("temperature", 1.0) == w.temperature
        assert req.top_p == (logged.get("top_p", 1.0) if req.temperature > 0 else 1.0)
        assert req.max_new_tokens == logged.get("max_tokens", 128)
        seen.setdefault(w.item.id, set()).add(w.seed)
    greedy = {it.id for it in suite.items if it.sampling and it.sampling.get("temperature") == 0.0}
    assert greedy and all(seen[i] == {0} for i in greedy)                          # greedy: one seed
    assert all(seeds == {0, 1} for i, seeds in seen.items() if i not in greedy)   # sampled: every seed


def batch_log(path: Path) -> Path:
    """A batch-API log: each request in a `body`, routed by `body.metadata.route`."""
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "x", "messages": [{"role": "user", "content": f"Ask {i}"}],
                                  "metadata": {"route": "search" if i % 3 else "support", "team": "core"}}})
             for i in range(9)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_category_field_with_or_without_the_metadata_prefix(tmp_path):
    log = batch_log(tmp_path / "batch.jsonl")
    cats = {}
    for field in ("route", "metadata.route"):
        out = tmp_path / f"{field}.jsonl"
        assert main(["suites", "import", str(log), "--out", str(out), "--category-field", field]) == 0
        cats[field] = [it.categories for it in load_suite(out).items]
        assert json.loads(out.read_text().splitlines()[0])["source"]["categories_from"] == "metadata.route"
    assert cats["route"] == cats["metadata.route"]
    assert cats["route"].count(("support",)) == 3 and cats["route"].count(("search",)) == 6


def test_category_field_found_in_no_request_is_an_error(tmp_path, capsys):
    log = batch_log(tmp_path / "batch.jsonl")
    out = tmp_path / "s.jsonl"
    assert main(["suites", "import", str(log), "--out", str(out), "--category-field", "app.team"]) == 2
    err = capsys.readouterr().err
    assert "app.team" in err and "found in no request" in err
    assert "route" in err and "team" in err  # the keys the requests do have
    assert not out.exists()
