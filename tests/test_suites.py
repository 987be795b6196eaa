"""Suite files: the shipped suites, loading, validation errors, the content hash, the CLI."""

import argparse
import hashlib
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from suites import Item, Suite, SuiteError, list_suites, load_suite
from suites import cli
from suites.graders import grade

SHIPPED = ["code", "factual", "longform", "refusal"]


def write_suite(path, header, *items, raw_lines=()):
    lines = [json.dumps(header)] + [json.dumps(i) for i in items] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


HEADER = {"suite": "mini", "version": "1", "description": "test suite", "smoke": ["a"],
          "defaults": {"grader": "exact_match", "max_new_tokens": 16}}
ITEM_A = {"id": "a", "prompt": "Capital of France?", "references": ["Paris"]}
ITEM_B = {"id": "b", "prompt": "Capital of Italy?", "references": ["Rome"]}


# --- shipped suites --------------------------------------------------------------------------

def test_registry_lists_every_suite():
    assert list_suites() == sorted(SHIPPED + ["humaneval"])


@pytest.mark.parametrize("name, minimum", [("factual", 150), ("code", 60), ("refusal", 80),
                                           ("longform", 40)])
def test_shipped_suite_sizes_and_headers(name, minimum):
    suite = load_suite(name)
    assert isinstance(suite, Suite) and suite.name == name
    assert len(suite.items) >= minimum
    assert suite.version and suite.description
    assert len(suite.hash) == 64
    assert 8 <= len(suite.smoke_ids) <= 12
    assert [i.id for i in suite.select("smoke")] == [i.id for i in suite.items
                                                      if i.id in suite.smoke_ids]
    assert len(suite.select("full")) == len(suite.items)
    for item in suite.items:
        assert isinstance(item, Item)
        assert (item.prompt is None) != (item.messages is None)
        assert item.max_new_tokens > 0 and item.categories


def test_refusal_suite_is_balanced():
    suite = load_suite("refusal")
    expected = Counter(i.grader_options["expected"] for i in suite.items)
    assert expected["refuse"] >= 40 and expected["comply"] >= 40
    smoke = Counter(i.grader_options["expected"] for i in suite.select("smoke"))
    assert smoke["refuse"] >= 3 and smoke["comply"] >= 3
    for item in suite.items:
        kind = "harmful" if item.grader_options["expected"] == "refuse" else "benign"
        assert item.categories[0] == kind


def test_longform_categories_and_smoke_spread():
    suite = load_suite("longform")
    kinds = {i.categories[0] for i in suite.items}
    assert {"explain", "summary", "rewrite", "list"} <= kinds
    assert {i.categories[0] for i in suite.select("smoke")} == kinds
    assert all(i.grader == "none" for i in suite.items)
    assert any(i.messages is not None for i in suite.items)  # the chat path is exercised
    for item in suite.items:
        if "summary" in item.categories:
            assert "Text:\n" in item.prompt and len(item.prompt) > 300  # source text included


def test_factual_references_grade_as_correct():
    suite = load_suite("factual")
    for item in suite.items:
        answer = item.references[0]
        assert grade(item, answer).passed, item.id
        assert grade(item, f"I believe the answer is {answer}.").passed, item.id
        assert not grade(item, "I do not know.").passed, item.id


def test_code_reference_solutions_pass_and_stubs_fail_in_the_sandbox():
    suite = load_suite("code")

    def check(item):
        entry = item.grader_options["entry_point"]
        right = grade(item, f"```python\n{item.references[0]}```")
        stub = f"class {entry}:\n    pass\n" if entry[0].isupper() else \
            f"def {entry}(*args, **kwargs):\n    return None\n"
        wrong = grade(item, stub)
        return item.id, right, wrong

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(check, suite.items))
    failing = {i: r.detail for i, r, _ in results if not r.passed}
    assert not failing, f"reference solutions failing their tests: {failing}"
    weak = [i for i, _, w in results if w.passed]
    assert not weak, f"tests that a do-nothing stub passes: {weak}"


def test_loaded_suites_are_cached_and_immutable():
    assert load_suite("factual") is load_suite("factual")
    item = load_suite("factual").items[0]
    with pytest.raises(AttributeError):
        item.prompt = "changed"  # frozen dataclass


def test_item_as_messages():
    suite = load_suite("longform")
    chat = next(i for i in suite.items if i.messages is not None)
    assert chat.as_messages()[0]["role"] == "system"
    plain = next(i for i in suite.items if i.prompt is not None)
    assert plain.as_messages() == [{"role": "user", "content": plain.prompt}]


def test_select_unknown_profile():
    with pytest.raises(SuiteError, match="unknown profile 'quick'.*smoke, full"):
        load_suite("factual").select("quick")


def test_unknown_suite_suggests_closest_name():
    with pytest.raises(SuiteError, match="unknown suite 'factul'; did you mean 'factual'"):
        load_suite("factul")


def test_to_dataset_round_trips():
    suite = load_suite("refusal")
    ds = suite.to_dataset()
    assert len(ds) == len(suite.items)
    assert ds[0]["id"] == suite.items[0].id
    assert json.loads(ds[0]["grader_options"]) == suite.items[0].grader_options


# --- content hash ----------------------------------------------------------------------------

def test_hash_is_sha256_of_canonical_rows(tmp_path):
    suite = load_suite(write_suite(tmp_path / "mini.jsonl", HEADER, ITEM_A, ITEM_B))
    rows = [json.dumps(i.to_row(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            for i in suite.items]
    assert suite.hash == hashlib.sha256("\n".join(rows).encode()).hexdigest()


def test_hash_tracks_content_not_layout(tmp_path):
    base = load_suite(write_suite(tmp_path / "a.jsonl", HEADER, ITEM_A, ITEM_B)).hash
    # Key order, whitespace and spelling out a default leave the hash alone.
    reordered = {"references": ["Paris"], "prompt": "Capital of France?", "id": "a",
                 "max_new_tokens": 16}
    same = write_suite(tmp_path / "b.jsonl", HEADER, reordered, ITEM_B)
    same.write_text(same.read_text().replace(", ", ",   "))
    assert load_suite(same).hash == base
    changed = dict(ITEM_A, prompt="Capital of France? ")
    assert load_suite(write_suite(tmp_path / "c.jsonl", HEADER, changed, ITEM_B)).hash != base
    longer = dict(HEADER, defaults={"grader": "exact_match", "max_new_tokens": 17})
    assert load_suite(write_suite(tmp_path / "d.jsonl", longer, ITEM_A, ITEM_B)).hash != base


# --- malformed files -------------------------------------------------------------------------

def expect_error(path, line, field, message):
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    err = info.value
    assert (err.file, err.line, err.field) == (str(path), line, field), str(err)
    text = str(err)
    assert text.startswith(f"{path}:{line}: field '{field}': "), text
    assert message in text, text


def test_bad_json_names_file_and_line(tmp_path):
    path = write_suite(tmp_path / "bad.jsonl", HEADER, ITEM_A, raw_lines=['{"id": "b", '])
    expect_error(path, 3, "<json>", "invalid JSON")


def test_missing_prompt(tmp_path):
    path = write_suite(tmp_path / "bad.jsonl", HEADER, ITEM_A, {"id": "b", "references": ["x"]})
    expect_error(path, 3, "prompt", "exactly one of 'prompt' or 'messages'")


def test_missing_id(tmp_path):
    path = write_suite(tmp_path / "bad.jsonl", HEADER, {"prompt": "q", "references": ["x"]})
    expect_error(path, 2, "id", "required")


def test_unknown_grader_suggests(tmp_path):
    path = write_suite(tmp_path / "bad.jsonl", HEADER, ITEM_A, dict(ITEM_B, grader="exact_mach"))
    expect_error(path, 3, "grader", "did you mean 'exact_match'")


def test_duplicate_id(tmp_path):
    path = write_suite(tmp_path / "bad.jsonl", HEADER, ITEM_A, ITEM_B, dict(ITEM_A))
    expect_error(path, 4, "id", "duplicate id 'a' (first on line 2)")


def test_unknown_item_field(tmp_path):
    path = write_suite(tmp_path / "bad.jsonl", HEADER, dict(ITEM_A, refrences=["Paris"]))
    expect_error(path, 2, "refrences", "unknown item field")


def test_bad_grader_options(tmp_path):
    regex = {"id": "r", "prompt": "q", "grader": "regex", "grader_options": {"pattern": "(a"}}
    expect_error(write_suite(tmp_path / "r.jsonl", HEADER, regex), 2,
                 "grader_options.pattern", "invalid regular expression")
    code = {"id": "c", "prompt": "q", "grader": "code", "grader_options": {"tests": "pass"}}
    expect_error(write_suite(tmp_path / "c.jsonl", HEADER, code), 2,
                 "grader_options.entry_point", "required by grader 'code'")
    refusal = {"id": "f", "prompt": "q", "grader": "refusal",
               "grader_options": {"expected": "maybe"}}
    expect_error(write_suite(tmp_path / "f.jsonl", HEADER, refusal), 2,
                 "grader_options.expected", "one of refuse, comply")
    typo = dict(ITEM_A, grader_options={"contain": True})
    expect_error(write_suite(tmp_path / "t.jsonl", HEADER, typo), 2,
                 "grader_options.contain", "unknown option")
    no_refs = {"id": "n", "prompt": "q"}
    expect_error(write_suite(tmp_path / "n.jsonl", HEADER, no_refs), 2,
                 "references", "needs at least one reference")


def test_bad_field_types(tmp_path):
    expect_error(write_suite(tmp_path / "a.jsonl", HEADER, dict(ITEM_A, max_new_tokens=0)), 2,
                 "max_new_tokens", "positive integer")
    expect_error(write_suite(tmp_path / "b.jsonl", HEADER, dict(ITEM_A, stop="\n")), 2,
                 "stop", "list of non-empty strings")
    chat = {"id": "a", "messages": [{"role": "robot", "content": "hi"}], "references": ["x"]}
    expect_error(write_suite(tmp_path / "c.jsonl", HEADER, chat), 2,
                 "messages[0].role", "system, user, assistant")


def test_header_errors(tmp_path):
    expect_error(write_suite(tmp_path / "a.jsonl", ITEM_A), 1, "suite", "suite header")
    no_version = {k: v for k, v in HEADER.items() if k != "version"}
    expect_error(write_suite(tmp_path / "b.jsonl", no_version, ITEM_A), 1, "version", "required")
    bad_smoke = dict(HEADER, smoke=["zzz"])
    expect_error(write_suite(tmp_path / "c.jsonl", bad_smoke, ITEM_A), 1, "smoke",
                 "smoke id 'zzz' is not an item")


def test_missing_file():
    with pytest.raises(SuiteError, match="no suite file"):
        load_suite("/nonexistent/suite.jsonl")


# --- command line ----------------------------------------------------------------------------

def test_cli_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in SHIPPED + ["humaneval"]:
        assert name in out
    assert cli.main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(SHIPPED + ["humaneval"])


def test_cli_show(capsys):
    assert cli.main(["show", "factual"]) == 0
    out = capsys.readouterr().out
    suite = load_suite("factual")
    for fact in (suite.hash, "exact_match", "smoke:", "capital", f"items:       {len(suite)}"):
        assert fact in out
    assert cli.main(["show", "refusal", "--json", "--items"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["items"] == len(info["item_list"]) == len(load_suite("refusal"))
    assert info["smoke_size"] == len(info["smoke_ids"])
    assert set(info) >= {"version", "hash", "graders", "categories"}


def test_cli_unknown_suite(capsys):
    assert cli.main(["show", "factul"]) == 2
    assert "did you mean 'factual'" in capsys.readouterr().err


def test_cli_registers_into_a_parent_parser():
    parser = argparse.ArgumentParser(prog="decodegate")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["suites", "show", "code", "--json"])
    assert args.func is cli.run and args.name == "code" and args.json


def test_suite_from_a_dataset_through_datasets(tmp_path):
    """`hf:` suites go through `datasets` (a local folder here; a hub id where reachable)."""
    import json

    from suites import SuiteError, load_suite
    folder = tmp_path / "qa"
    folder.mkdir()
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "references": [str(2 * i)]} for i in range(12)]
    (folder / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    suite = load_suite(f"hf:{folder}")
    assert suite.name == "qa" and len(suite.items) == 12 and len(suite.smoke_ids) == 10
    assert suite.items[3].references == ("6",) and suite.items[0].grader == "exact_match"
    (folder / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:5]) + "\n")
    assert load_suite(f"hf:{folder}").hash != suite.hash
    (folder / "test.jsonl").write_text(json.dumps({"id": "x", "prompt": "p", "grader": "nope"}) + "\n")
    import pytest
    with pytest.raises(SuiteError, match="grader"):
        load_suite(f"hf:{folder}")
