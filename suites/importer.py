"""`decodegate suites import FILE`: a team's own request logs as a versioned suite.

Input formats (`--format auto` tells them apart by the first non-blank line):
- `chat`: OpenAI-style chat request JSONL, one request per line: `messages` (required; content a
  string or a list of `{"type": "text", "text": ...}` parts), optional `temperature`, `top_p`,
  `max_tokens` (or `max_completion_tokens`), `stop`, `metadata`. A batch-API line (`{"body": {...}}`) is
  read through its body. Settings a suite cannot replay (`n` > 1, penalties, `logit_bias`, `seed`,
  `response_format`, `tools`, ...) are dropped with one warning, their counts in the header's
  `source.not_replayed`.
- `prompts`: a plain text file, one prompt per line (blank lines skipped).

What it does, in order: parse every line (a line that is not valid JSON, or lacks messages, fails
naming file and line, and nothing is written); drop exact duplicates (the same messages, sampling
and budget; the first is kept); assign categories from a metadata field (`--category-field`,
dotted for nesting; `route` and `metadata.route` alike; a field that no request has is an error
naming the keys they do have) or from prompt-length buckets in characters (`--length-buckets 200,1000`);
take a stratified sample (`--sample N --seed S`: proportional to each category's share, largest
remainders, every category at least one item while N allows); write the suite file atomically
(a temporary file, validated by the suite loader, then renamed: whole or not at all).

The suite keeps each item's logged `sampling` (temperature, top_p), its `stop` strings and
`max_tokens` as its budget; `temperatures = "as-logged"` in a profile runs each item with them. The header's `source`
records the file's sha256, its format, the duplicates removed and the sampling (size, seed,
per-category counts). Items are graded `none` (logs carry no right answers): such a suite measures
identity, acceptance and speed, not quality. Item ids are `line-N`, the line in the source file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

from suites.format import _NAME_RE as NAME_RE, SuiteError, item_from_row, load_file

SMOKE_SIZE = 10
FORMATS = ("auto", "chat", "prompts")
# Request settings a suite item cannot carry (the harness runs its own seeds and sampling), with
# their no-op values: a request that set one is replayed without it, which the import says (a
# warning with counts) and records in the header's `source`, never silently.
UNREPLAYABLE = {"n": (None, 1), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
                "logit_bias": (None, {}), "seed": (None,), "response_format": (None, {"type": "text"}),
                "tools": (None, []), "repetition_penalty": (None, 1),
                "top_k": (None, 0, -1), "min_p": (None, 0)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="request log: chat request JSONL, or a plain prompts file (one per line)")
    p.add_argument("--out", help="suite file to write (default: NAME.jsonl)")
    p.add_argument("--name", help="suite name (default: from the file name)")
    p.add_argument("--version", default="1", help="suite version (default: %(default)s); bump it when the "
                                                  "content changes")
    p.add_argument("--format", choices=FORMATS, default="auto", help="input format (default: %(default)s)")
    p.add_argument("--sample", type=int, help="stratified sample of this many items")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample (default: %(default)s)")
    cat = p.add_mutually_exclusive_group()
    cat.add_argument("--category-field", help="metadata field that names each item's category, dotted for "
                                              "nesting: route (or metadata.route), app.team")
    cat.add_argument("--length-buckets", help="categories by prompt length in characters: ascending edges, e.g. 200,1000")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help="budget of items whose request logged no max_tokens (default: %(default)s)")


def _fail(msg: str, file: str, line: int | None = None, field: str | None = None):
    raise SuiteError(msg, file=file, line=line, field=field)


def _content(content, file: str, line: int, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    _fail("content must be a string or a list of text parts (images and tools are not replayable here)",
          file, line, f"messages[{i}].content")


def _parse_chat(raw: str, file: str, line: int) -> dict:
    try:
        req = json.loads(raw)
    except json.JSONDecodeError as e:
        _fail(f"not valid JSON: {e.msg} (column {e.colno})", file, line, "<json>")
    if isinstance(req, dict) and isinstance(req.get("body"), dict):
        req = req["body"]  # the batch API's wrapper
    if not isinstance(req, dict):
        _fail(f"expected a JSON object, got {type(req).__name__}", file, line, "<json>")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        _fail("a chat request needs a non-empty 'messages' list", file, line, "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            _fail("each message needs 'role' and 'content'", file, line, f"messages[{i}]")
        turns.append({"role": m["role"], "content": _content(m["content"], file, line, i)})
    if not any(t["content"].strip() for t in turns):
        _fail("the conversation has no text (every message's content is empty)", file, line, "messages")
    sampling = {k: req[k] for k in ("temperature", "top_p") if req.get(k) is not None}
    # OpenAI's newer field: a request may send max_completion_tokens with max_tokens null or absent.
    budget = req.get("max_tokens")
    if budget is None:
        budget = req.get("max_completion_tokens")
    stop = req.get("stop")
    stop = [stop] if isinstance(stop, str) else stop  # the API takes one string or a list
    metadata = req.get("metadata") if isinstance(req.get("metadata"), dict) else {}
    dropped = sorted(k for k, no_op in UNREPLAYABLE.items() if k in req and req[k] not in no_op)
    return {"messages": turns, "sampling": sampling or None, "max_new_tokens": budget, "stop": stop or None,
            "metadata": metadata, "dropped": dropped, "line": line}


def _json_array(line: str) -> bool:
    """A line that opens a JSON array: `[` alone (pretty-printed) or an array on one line. A
    prompt such as `[INST] ...` is no JSON and stays a prompt."""
    if line.strip() == "[":
        return True
    if not line.lstrip().startswith("["):
        return False
    try:
        return isinstance(json.loads(line), list)
    except json.JSONDecodeError:
        return False


def parse_log(path: Path, fmt: str = "auto") -> tuple[list[dict], str]:
    """Requests of the log (each with its source line), and the format it was read as."""
    file = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        _fail(f"cannot read the request log: {e}", file)
    try:
        text = data.decode("utf-8-sig")  # -sig: a BOM (Windows tools write one) is not content
    except UnicodeDecodeError as e:  # the line, not a byte offset into a log of millions of bytes
        line = data[:e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        _fail(f"not UTF-8: byte 0x{data[e.start]:02x} at column {column} (re-encode the log as UTF-8, "
              f"e.g. iconv -f latin1 -t utf-8)", file, line)
    # "\n" only: splitlines() also splits on U+2028, U+2029 and U+0085, which JSON allows raw inside strings.
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    if fmt == "auto":
        first = next((ln for ln in lines if ln.strip()), "")
        if _json_array(first):  # read as prompts, the JSON text itself would become the suite's prompts
            _fail("the log is a JSON array; give one request object per line (JSONL), e.g. jq -c '.[]', or "
                  "--format prompts to import each line as a prompt", file, lines.index(first) + 1)
        fmt = "chat" if first.lstrip().startswith("{") else "prompts"
    out = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if fmt == "chat":
            out.append(_parse_chat(raw, file, lineno))
        else:
            out.append({"prompt": raw.strip(), "sampling": None, "max_new_tokens": None, "metadata": {},
                        "line": lineno})
    if not out:
        _fail("the request log holds no requests", file)
    return out, fmt


def _identity(req: dict) -> str:
    return json.dumps([req.get("messages"), req.get("prompt"), req.get("sampling"), req.get("max_new_tokens"),
                       req.get("stop")], sort_keys=True, ensure_ascii=False)


def dedupe(requests: list[dict]) -> tuple[list[dict], int]:
    seen, out = set(), []
    for r in requests:
        key = _identity(r)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out, len(requests) - len(out)


def _text(req: dict) -> str:
    return req["prompt"] if "prompt" in req else "\n".join(m["content"] for m in req["messages"])


def _category_name(value) -> str:
    name = re.sub(r"[\x00-\x1f\x7f]", "", re.sub(r"\s+", "-", str(value).strip()))   # categories name gates
    return name or "unknown"


def _lookup(metadata: dict, path: list[str]):
    value = metadata
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _key_paths(value, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves of a metadata object: what --category-field can name."""
    if not isinstance(value, dict) or not value:
        return [prefix] if prefix else []
    return [p for k, v in value.items() for p in _key_paths(v, f"{prefix}.{k}" if prefix else str(k))]


def resolve_field(requests: list[dict], field: str, file: str = "<log>") -> list[str]:
    """The path of `field` inside each request's `metadata`. `route` and `metadata.route` name the
    same field (the second spells out the request's own key); a key literally called
    `metadata` inside the metadata is taken first where requests have one. A field that no
    request has is an error naming the keys they do have: silence would file every item under
    "unknown"."""
    parts = field.split(".")
    if not all(parts):
        _fail(f"--category-field {field!r} has an empty part: give a dotted path such as route or app.team", file)
    paths = [parts] + ([parts[1:]] if parts[0] == "metadata" and len(parts) > 1 else [])
    for path in paths:
        if any(_lookup(r["metadata"], path) is not None for r in requests):
            return path
    keys = sorted({k for r in requests for k in _key_paths(r["metadata"])})
    have = (f"the requests' metadata has {', '.join(keys[:20])}" + (f" and {len(keys) - 20} more" if len(keys) > 20
                                                                      else "")) if keys else "no request has metadata"
    _fail(f"--category-field {field!r} is found in no request's metadata; {have}", file)


def categorize(requests: list[dict], *, field: str | None = None, buckets: list[int] | None = None,
               file: str = "<log>") -> str | None:
    """Set each request's `category` (in place) from a metadata field or length buckets; returns
    where the categories came from (`metadata.<path>` for a field)."""
    path = resolve_field(requests, field, file) if field else None
    for r in requests:
        if field:
            value = _lookup(r["metadata"], path)
            r["category"] = _category_name(value) if value is not None else "unknown"
        elif buckets:
            n = len(_text(r))
            low = max((b for b in buckets if b <= n), default=None)
            high = min((b for b in buckets if b > n), default=None)
            r["category"] = (f"len<{high}" if low is None else f"len>={low}" if high is None
                             else f"len{low}-{high}")
        else:
            r["category"] = None
    return "metadata." + ".".join(path) if path else None


def stratified_sample(requests: list[dict], size: int, seed: int) -> list[dict]:
    """`size` requests, each category represented in proportion (largest remainders; every
    category at least one while size allows), chosen with `seed`; source order is kept."""
    groups: dict = {}
    for r in requests:
        groups.setdefault(r.get("category"), []).append(r)
    if size >= len(requests):
        return list(requests)
    names = sorted(groups, key=lambda g: (g is None, str(g)))
    quota = {g: size * len(groups[g]) / len(requests) for g in names}
    take = {g: int(quota[g]) for g in names}
    if size >= len(names):
        for g in names:
            take[g] = max(take[g], 1)
    while sum(take.values()) > size:  # the minimum of one overshot: trim the largest
        g = max(names, key=lambda g: (take[g] - quota[g], take[g]))
        take[g] -= 1
    for g in sorted(names, key=lambda g: quota[g] - int(quota[g]), reverse=True):
        if sum(take.values()) >= size:
            break
        if take[g] < len(groups[g]):
            take[g] += 1
    rng = random.Random(seed)
    chosen = {id(r) for g in names for r in rng.sample(groups[g], min(take[g], len(groups[g])))}
    return [r for r in requests if id(r) in chosen]


def suite_rows(requests: list[dict], *, name: str, version: str, source: dict, max_new_tokens: int) -> list[dict]:
    items = []
    for r in requests:
        item = {"id": f"line-{r['line']}"}
        if "prompt" in r:
            item["prompt"] = r["prompt"]
        else:
            item["messages"] = r["messages"]
        if r.get("category"):
            item["categories"] = [r["category"]]
        if r.get("max_new_tokens") is not None:
            item["max_new_tokens"] = r["max_new_tokens"]
        if r.get("sampling"):
            item["sampling"] = r["sampling"]
        if r.get("stop") is not None:
            item["stop"] = r["stop"]
        items.append(item)
    smoke = [it["_id"] for it in stratified_sample(
        [dict(r, _id=f"line-{r['line']}") for r in requests], SMOKE_SIZE, 0)]
    header = {"suite": name, "version": version,
              "description": f"Imported from {source['file']} ({source['format']}, {len(items)} requests)",
              "smoke": smoke, "defaults": {"grader": "none", "max_new_tokens": max_new_tokens, "stop": []},
              "source": source}
    return [header, *items]


def write_atomically(rows: list[dict], out: Path) -> None:
    """Write the suite next to `out`, validate it with the suite loader, then rename it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())
        load_file(tmp)  # the file must load as a suite before it replaces anything
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def import_log(path: str | Path, *, out: str | Path | None = None, name: str | None = None, version: str = "1",
               fmt: str = "auto", sample: int | None = None, seed: int = 0, category_field: str | None = None,
               length_buckets: list[int] | None = None, max_new_tokens: int = 128) -> Path:
    """Turn a request log into a suite file; returns its path. Raises SuiteError on bad input."""
    path = Path(path)
    file = str(path)
    if fmt not in FORMATS:
        _fail(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}", file)
    # The flags the header is made of, checked here: the suite loader would find them only in the
    # temporary file, and name that file instead of the flag.
    if name is not None and not NAME_RE.match(name):
        _fail(f"--name {name!r}: a suite name is lower-case letters, digits, '-' and '_', starting with a letter "
              f"or digit", file)
    if not isinstance(version, str) or not version.strip():
        _fail(f"--version must be a non-empty string, got {version!r}", file)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        _fail(f"--max-new-tokens must be a positive integer, got {max_new_tokens!r}", file)
    if sample is not None and sample < 1:
        _fail(f"--sample must be a positive number of items, got {sample}", file)
    if length_buckets is not None and (not length_buckets or length_buckets != sorted(set(length_buckets))
                                       or length_buckets[0] <= 0):
        _fail(f"--length-buckets must be ascending positive edges, e.g. 200,1000; got {length_buckets}", file)
    name = name or re.sub(r"[^a-z0-9_-]+", "-", path.stem.lower()).strip("-_") or "imported"
    requests, fmt = parse_log(path, fmt)
    if category_field and fmt == "prompts":
        _fail("--category-field needs chat JSONL with metadata; a prompts file has none (use --length-buckets)", file)
    n_read = len(requests)
    requests, removed = dedupe(requests)
    field_path = categorize(requests, field=category_field, buckets=length_buckets, file=file)
    kept = stratified_sample(requests, sample, seed) if sample else requests
    source = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "format": fmt,
              "requests_read": n_read, "duplicates_removed": removed,
              "categories_from": (field_path if category_field else
                                  f"length buckets {length_buckets} (characters)" if length_buckets else None),
              "sampling": {"size": sample, "seed": seed, "method": "stratified by category, proportional",
                           "population": len(requests),
                           "per_category": dict(sorted(Counter(str(r.get("category")) for r in kept).items()))}
              if sample else None}
    dropped = Counter(k for r in kept for k in r.get("dropped", ()))
    if dropped:  # once, with counts: replayed without them, these items are not the logged requests
        source["not_replayed"] = dict(sorted(dropped.items()))
        print(f"decodegate: warning: {path.name}: settings a suite cannot replay, dropped: "
              + ", ".join(f"{k} ({n} request{'s' if n > 1 else ''})" for k, n in sorted(dropped.items()))
              + "; recorded in the header's source.not_replayed", file=sys.stderr)
    rows = suite_rows(kept, name=name, version=version, source=source, max_new_tokens=max_new_tokens)
    for i, row in enumerate(rows[1:]):  # fail on the log's line, not on the suite's
        item_from_row(row, rows[0]["defaults"], file=file, line=kept[i]["line"])
    out = Path(out) if out else Path(f"{name}.jsonl")
    if out.is_dir():
        _fail(f"--out {out} is a folder; give the suite file's path, e.g. {out / (name + '.jsonl')}", file)
    if out.exists():
        try:
            old = load_file(out)
        except SuiteError as e:  # another file at --out: said as such, and never overwritten
            raise SuiteError(f"--out {out} exists and is not a suite file ({e}); give another --out, or remove it "
                             f"first") from None
        from suites.format import make_suite
        new = make_suite(name=name, version=version, description="", source=str(out), smoke_ids=rows[0]["smoke"],
                         items=[item_from_row(r, rows[0]["defaults"]) for r in rows[1:]])
        if old.version == version and old.hash != new.hash:
            _fail(f"{out} already holds version {version} of suite {old.name!r} with other content; "
                  f"give a new --version (suites are versioned: a changed prompt is a new version)", file)
    write_atomically(rows, out)
    return out


def run(args) -> int:
    buckets = None
    if args.length_buckets:
        try:
            buckets = [int(x) for x in args.length_buckets.split(",") if x.strip()]
        except ValueError:
            raise SuiteError(f"--length-buckets takes comma-separated integers, got {args.length_buckets!r}") from None
    out = import_log(args.file, out=args.out, name=args.name, version=args.version, fmt=args.format,
                     sample=args.sample, seed=args.seed, category_field=args.category_field,
                     length_buckets=buckets, max_new_tokens=args.max_new_tokens)
    suite = load_file(out)
    cats = Counter(c for item in suite.items for c in item.categories)
    print(f"wrote {out}: suite {suite.name} v{suite.version}, {len(suite.items)} items, sha256:{suite.hash[:12]}"
          + (f"; categories: {', '.join(f'{c} ({n})' for c, n in sorted(cats.items()))}" if cats else ""))
    return 0
