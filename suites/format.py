"""The suite file format: records, strict loading and validation, and the content hash.

A suite is one JSONL file. Its first record is the header; every later line is one item:

    {"suite": "factual", "version": "1", "description": "...", "smoke": ["cap-fr", ...],
     "defaults": {"grader": "exact_match", "max_new_tokens": 32, "stop": []}}
    {"id": "cap-fr", "prompt": "What is the capital of France?", "references": ["Paris"],
     "categories": ["geography"]}

Item fields: `id` (unique), exactly one of `prompt` (text) or `messages` (chat turns, each
{"role": "system"|"user"|"assistant", "content": str}), `references` (accepted answers, or a
reference solution), `grader` and `grader_options` (see `suites.graders`), `categories`,
`max_new_tokens`, `stop`, and `sampling` ({"temperature", "top_p"}: the settings a logged request
used; a profile with `temperatures = "as-logged"` runs each item with them). Missing generation
fields come from the header's `defaults`. The header's optional `source` records where an
imported suite came from (file, sha256, how it was sampled: see `suites.importer`).

Files are read line by line here rather than through `datasets`: only a line reader can name the
line of a bad record, and Arrow's schema inference would fill every item's `grader_options` with
the union of all items' keys (as nulls), changing the content. `Suite.to_dataset()` hands a
validated suite to `datasets` for tools (lm-eval) that want one.

The content hash is sha256 over the canonical JSON of every item (defaults applied, keys sorted),
one per line, in file order: two runs compare outputs only when the hashes are equal. A changed
prompt, reference, grader option or generation default changes the hash; bump `version` with it.
"""

from __future__ import annotations

import math

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suites.grader_options import OPTIONS as GRADER_OPTIONS, check_options, unknown_grader_message

DEFAULT_MAX_NEW_TOKENS = 128
PROFILES = ("smoke", "full")
ROLES = ("system", "user", "assistant")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_HEADER_KEYS = {"suite", "version", "description", "smoke", "defaults", "source"}
_DEFAULT_KEYS = {"grader", "max_new_tokens", "stop"}
_ITEM_KEYS = {"id", "prompt", "messages", "references", "grader", "grader_options",
              "categories", "max_new_tokens", "stop", "sampling"}
_SAMPLING_KEYS = ("temperature", "top_p")


class SuiteError(ValueError):
    """A malformed suite file, an unknown suite or grader, a bad profile name."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None):
        where = ":".join(str(p) for p in (file, line) if p is not None)
        prefix = f"{where}: " if where else ""
        prefix += f"field '{field}': " if field else ""
        super().__init__(prefix + message)
        self.file, self.line, self.field = file, line, field


@dataclass(frozen=True)
class Item:
    """One prompt of a suite. Sequences are tuples so that a loaded suite cannot drift, except
    `messages`: a list, the type chat-template code (transformers, our model wrapper) expects.
    Treat it and `grader_options` as read-only: both are part of the content hash."""

    id: str
    prompt: str | None
    messages: list[dict] | None
    references: tuple[str, ...]
    grader: str
    grader_options: dict
    categories: tuple[str, ...]
    max_new_tokens: int
    stop: tuple[str, ...]
    sampling: dict | None = None  # logged {"temperature", "top_p"} (suites import); None: not logged

    def as_messages(self) -> list[dict]:
        """The chat turns to send: `messages`, or `prompt` as a single user turn."""
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt}]

    def to_row(self) -> dict[str, Any]:
        """Plain JSON-able form; also the canonical form the content hash is computed over."""
        row = {"id": self.id, "prompt": self.prompt,
               "messages": None if self.messages is None else [dict(m) for m in self.messages],
               "references": list(self.references), "grader": self.grader,
               "grader_options": dict(self.grader_options), "categories": list(self.categories),
               "max_new_tokens": self.max_new_tokens, "stop": list(self.stop)}
        if self.sampling is not None:  # only when logged: suites without it keep their hash
            row["sampling"] = dict(self.sampling)
        return row


@dataclass(frozen=True)
class Suite:
    name: str
    version: str
    description: str
    items: tuple[Item, ...]
    smoke_ids: tuple[str, ...]
    hash: str    # sha256 hex of the canonical item rows
    source: str  # where it was loaded from (a path, or a package's data file)

    def select(self, profile: str) -> list[Item]:
        """`smoke`: the fixed smoke subset in file order; `full`: every item."""
        if profile == "full":
            return list(self.items)
        if profile == "smoke":
            wanted = set(self.smoke_ids)
            return [item for item in self.items if item.id in wanted]
        raise SuiteError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")

    def get(self, item_id: str) -> Item:
        for item in self.items:
            if item.id == item_id:
                return item
        raise KeyError(f"suite {self.name!r} has no item {item_id!r}")

    def __len__(self) -> int:
        return len(self.items)

    def to_dataset(self):
        """The items as a `datasets.Dataset` (nested fields JSON-encoded to keep them exact)."""
        import datasets  # heavy; only for callers that want it

        rows = [dict(row, messages=json.dumps(row["messages"]),
                     grader_options=json.dumps(row["grader_options"], sort_keys=True))
                for row in (item.to_row() for item in self.items)]
        return datasets.Dataset.from_list(rows)


def content_hash(items) -> str:
    lines = (json.dumps(item.to_row(), sort_keys=True, ensure_ascii=False,
                        separators=(",", ":")) for item in items)
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def make_suite(*, name: str, version: str, description: str, items, smoke_ids,
               source: str, header_line: int | None = None) -> Suite:
    """Assemble a suite from validated items, checking the smoke ids; computes the hash."""
    items = tuple(items)
    known = {item.id for item in items}
    if len(known) != len(items):  # records pair on the id: one id must be one item, whatever loaded it
        seen = set()
        dup = next(item.id for item in items if item.id in seen or seen.add(item.id))
        raise SuiteError(f"duplicate id {dup!r}", file=source, line=header_line, field="id")
    smoke_ids = tuple(smoke_ids)
    for sid in smoke_ids:
        if sid not in known:
            raise SuiteError(f"smoke id {sid!r} is not an item of the suite", file=source,
                             line=header_line, field="smoke")
    if len(set(smoke_ids)) != len(smoke_ids):
        raise SuiteError("smoke ids repeat", file=source, line=header_line, field="smoke")
    return Suite(name=name, version=version, description=description, items=items,
                 smoke_ids=smoke_ids, hash=content_hash(items), source=source)


def load_file(path: str | Path) -> Suite:
    """Read and validate one suite file; raise SuiteError naming file, line and field."""
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"cannot read suite file: {exc}", file=file) from None
    header, items, first_line = None, [], {}
    # "\n" only: splitlines() also splits on U+2028, U+2029 and U+0085, which JSON allows raw in strings
    # (an imported request log keeps them: `suites import` writes with ensure_ascii=False).
    for lineno, raw in enumerate((ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"invalid JSON: {exc.msg} (column {exc.colno})", file=file,
                             line=lineno, field="<json>") from None
        if not isinstance(record, dict):
            raise SuiteError(f"expected a JSON object, got {type(record).__name__}", file=file,
                             line=lineno, field="<json>")
        if header is None:
            header = _parse_header(record, file, lineno)
            header_line = lineno
            continue
        item = item_from_row(record, header["defaults"], file=file, line=lineno)
        if item.id in first_line:
            raise SuiteError(f"duplicate id {item.id!r} (first on line {first_line[item.id]})",
                             file=file, line=lineno, field="id")
        first_line[item.id] = lineno
        items.append(item)
    if header is None:
        raise SuiteError("empty suite file: expected a header record", file=file, line=1)
    if not items:
        raise SuiteError("the suite has no items", file=file)
    return make_suite(name=header["suite"], version=header["version"],
                      description=header["description"], items=items,
                      smoke_ids=header["smoke"], source=file, header_line=header_line)


def _parse_header(record: dict, file: str, line: int) -> dict:
    def fail(field, message):
        raise SuiteError(message, file=file, line=line, field=field)

    if "suite" not in record:
        fail("suite", "the first record must be the suite header (with a 'suite' name)")
    for key in record:
        if key not in _HEADER_KEYS:
            fail(key, f"unknown header field; expected {sorted(_HEADER_KEYS)}")
    for key in ("suite", "version", "description"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            fail(key, "required, a non-empty string")
    if not _NAME_RE.match(record["suite"]):
        fail("suite", "lower-case letters, digits, '-' and '_' only")
    smoke = record.get("smoke")
    if not isinstance(smoke, list) or not smoke or not all(isinstance(s, str) for s in smoke):
        fail("smoke", "required, a non-empty list of item ids")
    if "source" in record and not isinstance(record["source"], dict):
        fail("source", "must be an object (file, sha256, sampling)")
    defaults = record.get("defaults", {})
    if not isinstance(defaults, dict):
        fail("defaults", "must be an object")
    for key in defaults:
        if key not in _DEFAULT_KEYS:
            fail(f"defaults.{key}", f"unknown default; expected {sorted(_DEFAULT_KEYS)}")
    return dict(record, defaults=defaults)


def item_from_row(row: dict, defaults: dict | None = None, *, file: str = "<memory>",
                  line: int | None = None) -> Item:
    """Validate one item record (defaults applied) and build the Item."""
    defaults = defaults or {}

    def fail(field, message):
        raise SuiteError(message, file=file, line=line, field=field)

    for key in row:
        if key not in _ITEM_KEYS:
            fail(key, f"unknown item field; expected one of {sorted(_ITEM_KEYS)}")
    item_id = row.get("id")
    if not isinstance(item_id, str) or not _ID_RE.match(item_id):
        fail("id", "required, a string of letters, digits and _ . : / - (not starting with one "
                   "of the punctuation marks)")
    prompt, messages = row.get("prompt"), row.get("messages")
    if (prompt is None) == (messages is None):
        fail("prompt", "give exactly one of 'prompt' or 'messages'")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        fail("prompt", "must be a non-empty string")
    if messages is not None:
        messages = _check_messages(messages, fail)
    references = _string_list(row.get("references", []), "references", fail)
    grader = row.get("grader", defaults.get("grader"))
    if grader is None:
        fail("grader", "required (on the item or in the header's defaults)")
    if not isinstance(grader, str) or grader not in GRADER_OPTIONS:
        fail("grader", unknown_grader_message(grader))
    options = row.get("grader_options", {})
    if not isinstance(options, dict):
        fail("grader_options", "must be an object")
    for field, message in check_options(grader, options, references):
        fail(field, f"item {item_id!r}: {message}")
    categories = _string_list(row.get("categories", []), "categories", fail)
    max_new = row.get("max_new_tokens", defaults.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new <= 0:
        fail("max_new_tokens", "must be a positive integer")
    stop = _string_list(row.get("stop", defaults.get("stop", [])), "stop", fail)
    sampling = _check_sampling(row["sampling"], fail) if row.get("sampling") is not None else None
    return Item(id=item_id, prompt=prompt, messages=messages, references=references,
                grader=grader, grader_options=dict(options), categories=categories,
                max_new_tokens=max_new, stop=stop, sampling=sampling)


def _check_sampling(sampling, fail) -> dict:
    if not isinstance(sampling, dict):
        fail("sampling", f"must be an object with keys among {sorted(_SAMPLING_KEYS)}")
    for key, value in sampling.items():
        if key not in _SAMPLING_KEYS:
            fail(f"sampling.{key}", f"unknown sampling setting; expected one of {sorted(_SAMPLING_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"sampling.{key}", "must be a number")
        if not math.isfinite(value):  # NaN passes every < and > check below
            fail(f"sampling.{key}", f"must be a finite number, got {value!r}")
    if sampling.get("temperature", 0.0) < 0:
        fail("sampling.temperature", "must be >= 0")
    if "top_p" in sampling and not 0 < sampling["top_p"] <= 1:
        fail("sampling.top_p", "must be in (0, 1]")
    return {k: float(v) for k, v in sorted(sampling.items())}


def _check_messages(messages, fail) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        fail("messages", "must be a non-empty list of {role, content} objects")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or set(msg) != {"role", "content"}:
            fail(f"messages[{i}]", "must be an object with exactly 'role' and 'content'")
        if msg["role"] not in ROLES:
            fail(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}")
        if not isinstance(msg["content"], str):
            fail(f"messages[{i}].content", "must be a string")
        out.append({"role": msg["role"], "content": msg["content"]})
    return out


def _string_list(value, field, fail) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        fail(field, "must be a list of non-empty strings")
    return tuple(value)
