"""lm-eval through decodegate: the `decodegate` lm-eval model, per-sample records for the
analysis, the gsm8k wiring on local rows, suites exported as lm-eval tasks, the command line,
and bad input. Offline, on the tiny models and the local tasks in tests/data/lmeval/.

lm-eval's command line always indexes its ~14k built-in tasks (10-20 s here); the command-line
tests swap in a TaskManager without them (`local_tasks_only`), which changes nothing else.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
import lm_eval.tasks  # noqa: E402
from lm_eval.api.registry import get_model as lmeval_get_model  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from analysis import pair_records, token_identity  # noqa: E402
from decoders import GenerationResult, Timing  # noqa: E402
from decoders.base import DecoderError  # noqa: E402
from harness.run import lmeval as bridge  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.run.lmeval import DecodegateLM, LmEvalError, lmeval_records  # noqa: E402
from harness.commands.lmeval import lmeval_argv  # noqa: E402
from helpers import regress, write_regress_config  # noqa: E402

LOCAL = Path(__file__).parent / "data" / "lmeval"
GEN, MC, GSM8K = "decodegate_tiny_gen", "decodegate_tiny_mc", "gsm8k_local"
CONTRACT = {"candidate", "decoder", "suite", "suite_version", "suite_hash", "item_id", "categories",
            "seed", "temperature", "tokens", "text", "score", "passed", "margins", "stats", "timing"}


def local_tm():
    return bridge.task_manager(str(LOCAL), False)


@pytest.fixture
def local_tasks_only(monkeypatch):
    """lm-eval's TaskManager without the built-in tasks (the index costs 10-20 s)."""
    class LocalOnly(lm_eval.tasks.TaskManager):
        def __init__(self, *args, **kwargs):
            kwargs["include_defaults"] = False
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalOnly)
    bridge.task_manager.cache_clear()
    yield
    bridge.task_manager.cache_clear()


# ----------------------------------------------------------------------------- the lm-eval model

def test_generate_until_and_multiple_choice_through_the_decodegate_model():
    lm = lmeval_get_model("decodegate").create_from_arg_string(
        "target=tiny-llama,decoder=standard,seed=0", {"batch_size": 1, "device": "cpu"})
    assert isinstance(lm, DecodegateLM) and isinstance(lm, HFLM)
    # Loglikelihood stays HF's; only generation is ours.
    assert type(lm).loglikelihood is HFLM.loglikelihood
    assert type(lm).loglikelihood_rolling is HFLM.loglikelihood_rolling
    out = lm_eval.simple_evaluate(model=lm, tasks=[GEN, MC], task_manager=local_tm(), limit=2,
                                  log_samples=True, bootstrap_iters=0)
    assert "exact_match,none" in out["results"][GEN]
    assert "acc,none" in out["results"][MC] and "acc_norm,none" in out["results"][MC]
    gen = out["samples"][GEN]
    assert len(gen) == 2 and len(out["samples"][MC]) == 2
    # Every generate_until request went through our decoder (and only those).
    assert len(lm.generations) == 2
    for sample in gen:
        context, kwargs = sample["arguments"][0]
        served = lm.generation_for(context, kwargs)
        assert served is not None and served.result.decoder == "standard"
        assert sample["resps"][0][0] == served.text
        assert "\n" not in served.text  # the task's `until`
        assert len(served.result.tokens) <= 12  # its max_gen_toks
        assert served.result.stats["target_forwards"] >= 1
    assert out["config"]["decodegate_decoder"] == "standard"


def test_generations_equal_lm_evals_own_hf_backend(tiny_llama):
    """Same encoding, stop sequences and post-processing as HFLM: greedy texts are identical."""
    tm = local_tm()
    hf = lm_eval.simple_evaluate(model=HFLM(pretrained=tiny_llama.model, tokenizer=tiny_llama.tokenizer),
                                 tasks=[GEN], task_manager=tm, limit=2, bootstrap_iters=0)
    ours = lm_eval.simple_evaluate(model=DecodegateLM(target=tiny_llama, decoder="standard"),
                                   tasks=[GEN], task_manager=tm, limit=2, bootstrap_iters=0)
    texts = [[s["resps"][0][0] for s in r["samples"][GEN]] for r in (hf, ours)]
    assert texts[0] == texts[1]


def test_model_arg_temperature_overrides_the_task_and_seed_keys_sampling(tiny_llama):
    lm = DecodegateLM(target=tiny_llama, decoder="standard", temperature=0.8, seed=7)
    eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    request, until = lm._request("Q: hi\nA:", {"until": ["\n"], "max_gen_toks": 5, "do_sample": False}, eos)
    assert request.temperature == 0.8 and request.seed == 7 and request.max_new_tokens == 5
    assert until == ["\n", eos] and "\n" in request.stop_strings
    assert tiny_llama.tokenizer.eos_token_id in request.stop_token_ids
    plain = DecodegateLM(target=tiny_llama, decoder="standard")
    req, _ = plain._request("Q: hi\nA:", {"until": [], "max_gen_toks": 4, "do_sample": True, "temperature": 0.5, "top_p": 0.9}, eos)
    assert (req.temperature, req.top_p) == (0.5, 0.9)
    req, _ = plain._request("Q: hi\nA:", {"until": [], "max_gen_toks": 4, "do_sample": False, "temperature": 0.5}, eos)
    assert req.temperature == 0.0


# ----------------------------------------------------------------------------- records, analysis

def test_speculative_greedy_equals_standard_and_records_pair(tiny_llama):
    base = lmeval_records(GEN, tiny_llama, "standard", {}, candidate="baseline",
                          include_path=str(LOCAL), limit=3)
    cand = lmeval_records(GEN, tiny_llama, "speculative", {"draft": "tiny-llama", "k": 3},
                          candidate="spec-k3", include_path=str(LOCAL), limit=3)
    assert len(base) == len(cand) == 3
    for rec in base + cand:
        assert CONTRACT <= set(rec)
        assert rec["suite"] == f"lmeval:{GEN}" and rec["suite_version"] == "1.0"
        assert rec["tokens"] and len(rec["margins"]) == len(rec["tokens"])
        assert isinstance(rec["score"], float) and isinstance(rec["passed"], bool)
        assert rec["timing"]["wall_s"] > 0
        json.dumps(rec)  # records are plain JSON rows
    assert [r["item_id"] for r in base] == ["0", "1", "2"]
    assert {r["decoder"] for r in cand} == {"speculative"}
    assert sum(r["stats"]["proposed"] for r in cand) > 0
    pairs = pair_records(base, cand)
    assert len(pairs) == 3
    identity = token_identity(pairs)
    assert identity.statistic == 1.0, identity.divergences
    assert [r["text"] for r in base] == [r["text"] for r in cand]


def test_multiple_choice_records_have_no_tokens_and_pair(tiny_llama):
    base = lmeval_records(MC, tiny_llama, "standard", {}, candidate="baseline", include_path=str(LOCAL), limit=2)
    cand = lmeval_records(MC, tiny_llama, "hf", {}, candidate="hf", include_path=str(LOCAL), limit=2)
    assert len(base) == 2
    for rec in base:
        assert CONTRACT <= set(rec)
        assert rec["tokens"] == [] and rec["margins"] == [] and rec["lmeval"]["metric"] == "acc"
        assert rec["score"] in (0.0, 1.0) and rec["passed"] is (rec["score"] == 1.0)
        assert rec["text"] in (" dog", " cat", " fish", " 3", " 7", " 10", " 0", " 50", " 100",
                               " green", " red", " brown")
    pairs = pair_records(base, cand)
    assert [p.baseline["score"] for p in pairs] == [p.candidate["score"] for p in pairs]
    # The hash covers the task's docs and config: another task, another hash.
    gen = lmeval_records(GEN, tiny_llama, "standard", {}, candidate="baseline", include_path=str(LOCAL), limit=1)
    assert gen[0]["suite_hash"] != base[0]["suite_hash"]


def _flaky_build(monkeypatch, fail_on: dict):
    """Build the real decoder, but fail the requests whose prompt contains a key of `fail_on`
    with that exception (what non-finite logits or an engine's refusal raise)."""
    import harness.build

    real = harness.build.build_decoder

    class Flaky:
        def __init__(self, inner, target):
            self.inner, self.target, self.name = inner, target, inner.name

        def generate(self, request):
            prompt = self.target.tokenizer.decode(list(request.prompt_ids))
            for text, error in fail_on.items():
                if text in prompt:
                    raise error
            return self.inner.generate(request)

    monkeypatch.setattr(harness.build, "build_decoder",
                        lambda name, target, options, *a: Flaky(real(name, target, options, *a), target))


def test_one_failed_generation_is_an_error_row_not_the_end_of_the_task(tiny_llama, monkeypatch):
    """A DecoderError on one lm-eval document (before: raised out of lmeval_records, ending the
    regress run with no summary) is that document's error row, as make_row records one for the
    runner's own suites; the other documents are generated and graded as usual."""
    from harness.verdict.summary import _identity

    base = lmeval_records(GEN, tiny_llama, "standard", {}, candidate="baseline", include_path=str(LOCAL))
    _flaky_build(monkeypatch, {"capital of France": DecoderError("non-finite logits at step 0")})
    cand = lmeval_records(GEN, tiny_llama, "standard", {}, candidate="flaky", include_path=str(LOCAL))
    assert [r["item_id"] for r in cand] == ["0", "1", "2", "3", "4"]
    bad = cand[2]
    assert bad["error"] == "non-finite logits at step 0"
    assert (bad["passed"], bad["score"], bad["tokens"], bad["text"], bad["margins"]) == (False, 0.0, [], "", [])
    assert CONTRACT <= set(bad) and json.dumps(bad)
    for good, ref in zip(cand[:2] + cand[3:], base[:2] + base[3:]):
        assert "error" not in good and good["tokens"] == ref["tokens"] and good["passed"] is ref["passed"]
    identity = _identity(pair_records(base, cand), eps=1e-3)
    assert identity["errored"] == 1 and identity["n"] == 4 and identity["rate"] == 1.0
    # An engine that went down is not one item's failure: it still ends the task.
    from decoders.engines.server import EngineDown
    _flaky_build(monkeypatch, {"spider": EngineDown("engine stopped answering")})
    with pytest.raises(EngineDown, match="stopped answering"):
        lmeval_records(GEN, tiny_llama, "standard", {}, candidate="down", include_path=str(LOCAL))


# ----------------------------------------------------------------------------- gsm8k wiring

def test_gsm8k_local_config_is_upstream_gsm8k_but_the_data():
    from lm_eval.tasks._yaml_loader import load_yaml

    upstream = load_yaml(Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml", resolve_func=False)
    local = load_yaml(LOCAL / "gsm8k_local.yaml", resolve_func=False)
    differ = {"task", "tag", "dataset_path", "dataset_name", "dataset_kwargs", "custom_dataset"}
    assert {k: v for k, v in local.items() if k not in differ} == \
           {k: v for k, v in upstream.items() if k not in differ}
    for name in ("gsm8k_train.jsonl", "gsm8k_test.jsonl"):
        for line in (LOCAL / name).read_text().splitlines():
            row = json.loads(line)
            assert set(row) == {"question", "answer"} and "\n#### " in row["answer"]


class CannedDecoder:
    """Answers each gsm8k_local question with a fixed completion (right for doc 0 and 2)."""

    name = "canned"
    ANSWERS = {"A class has 28": " 28 - 4 = 24, 24 / 6 = 4.\n#### 4", "Lena saves": " She has $40.\n#### 40",
               "A baker makes": " 1200 - 900 = 300.\n#### 300\n\nQuestion: more"}

    def __init__(self, target):
        self.target = target

    def generate(self, request):
        prompt = self.target.tokenizer.decode(list(request.prompt_ids))
        last = prompt.rsplit("Question: ", 1)[-1]
        text = next(v for k, v in self.ANSWERS.items() if last.startswith(k))
        tokens = tuple(self.target.tokenizer(text, add_special_tokens=False)["input_ids"])
        return GenerationResult(tokens=tokens, text=text, decoder=self.name, finish_reason="stop_string",
                                timing=Timing(0.01, 0.001, (0.001,) * len(tokens)),
                                margins=(1.0,) * len(tokens), stats={"target_forwards": len(tokens)})


def test_gsm8k_format_rows_score_through_lm_evals_filters(tiny_llama, monkeypatch):
    import harness.build

    monkeypatch.setattr(harness.build, "build_decoder", lambda name, target, options: CannedDecoder(target))
    records = lmeval_records(GSM8K, tiny_llama, "standard", {}, candidate="c", include_path=str(LOCAL),
                             num_fewshot=2, gen_kwargs={"max_gen_toks": 32})
    assert [r["item_id"] for r in records] == ["0", "1", "2"]
    assert {(r["lmeval"]["filter"], r["lmeval"]["metric"]) for r in records} == {("strict-match", "exact_match")}
    assert [r["score"] for r in records] == [1.0, 0.0, 1.0]
    assert [r["passed"] for r in records] == [True, False, True]
    assert [r["lmeval"]["extracted"] for r in records] == ["4", "40", "300"]
    assert records[0]["suite_version"] == "3.0"
    # lm-eval's `until` ("Question:") cut the third completion's text.
    assert "Question" not in records[2]["text"] and records[2]["tokens"]


def test_gsm8k_local_runs_through_a_real_decoder(tiny_llama):
    lm = DecodegateLM(target=tiny_llama, decoder="standard")
    out = lm_eval.simple_evaluate(model=lm, tasks=[GSM8K], task_manager=local_tm(), num_fewshot=2,
                                  gen_kwargs={"max_gen_toks": 8}, limit=2, log_samples=True,
                                  bootstrap_iters=0)
    assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(out["results"][GSM8K])
    for gen in lm.generations:
        assert gen.context.count("Question:") == 3  # two shots and the question
        assert len(gen.result.tokens) <= 8
        assert "Question:" in json.loads(gen.gen_kwargs)["until"]


# ----------------------------------------------------------------------------- exported suites

def test_exported_suites_round_trip_and_grade(tmp_path):
    from suites import list_suites, load_suite
    from suites.lmeval_export import doc_to_item, doc_to_text, export_suites, process_results

    names = export_suites(tmp_path)
    assert names == [f"decodegate_{n}" for n in list_suites()]
    for name in list_suites():
        suite = load_suite(name)
        docs = [json.loads(x) for x in (tmp_path / f"decodegate_{name}.jsonl").read_text().splitlines()]
        assert [doc_to_item(d) for d in docs] == list(suite.items)
        assert all(doc_to_text(d) for d in docs)
    factual = json.loads((tmp_path / "decodegate_factual.jsonl").read_text().splitlines()[0])
    assert process_results(factual, [factual["references"][0]]) == {"score": 1.0, "passed": 1.0}
    assert process_results(factual, ["no idea"]) == {"score": 0.0, "passed": 0.0}
    longform = json.loads((tmp_path / "decodegate_longform.jsonl").read_text().splitlines()[0])
    assert math.isnan(process_results(longform, ["anything"])["passed"])
    tm = lm_eval.tasks.TaskManager(include_path=str(tmp_path), include_defaults=False)
    assert set(names) <= set(tm.all_tasks)
    assert "unsafe_code: true" in (tmp_path / "decodegate_code.yaml").read_text()


def test_exported_suite_runs_as_an_lm_eval_task(tiny_llama, tmp_path):
    from suites.lmeval_export import export_suites

    export_suites(tmp_path, ["factual", "longform"], profile="smoke")
    kw = dict(include_path=str(tmp_path), limit=2, gen_kwargs={"max_gen_toks": 4})
    factual = lmeval_records("decodegate_factual_smoke", tiny_llama, "standard", {}, candidate="b", **kw)
    longform = lmeval_records("decodegate_longform_smoke", tiny_llama, "standard", {}, candidate="b", **kw)
    assert factual[0]["suite_version"] == "1" and factual[0]["lmeval"]["metric"] == "score"
    assert factual[0]["categories"] and all(isinstance(r["passed"], bool) for r in factual)
    assert all(r["passed"] is None for r in longform)  # ungraded suite
    assert all(1 <= len(r["tokens"]) <= 4 for r in factual + longform)


def test_suite_with_mixed_generation_settings_exports_as_a_group(tiny_llama, tmp_path):
    from suites.format import item_from_row, make_suite
    from suites.lmeval_export import export_suite

    items = [item_from_row({"id": "a", "prompt": "Say yes.", "references": ["yes"], "grader": "contains",
                            "max_new_tokens": 3}),
             item_from_row({"id": "b", "prompt": "Say no.", "references": ["no"], "grader": "contains",
                            "max_new_tokens": 5, "stop": ["."]})]
    suite = make_suite(name="mixed", version="2", description="two settings", items=items,
                       smoke_ids=["a"], source="<test>")
    names = export_suite(suite, tmp_path)
    assert names == ["decodegate_mixed", "decodegate_mixed_0", "decodegate_mixed_1"]
    records = lmeval_records("decodegate_mixed", tiny_llama, "standard", {}, candidate="b",
                             include_path=str(tmp_path))
    assert sorted(r["item_id"] for r in records) == ["decodegate_mixed_0:0", "decodegate_mixed_1:0"]
    by_id = {r["item_id"]: r for r in records}
    assert len(by_id["decodegate_mixed_0:0"]["tokens"]) <= 3 and len(by_id["decodegate_mixed_1:0"]["tokens"]) <= 5
    assert records[0]["categories"][0].startswith("decodegate_mixed_")


# ----------------------------------------------------------------------------- command line

def test_lmeval_argv_fills_in_run_and_model():
    assert lmeval_argv(["--tasks", "x"]) == ["run", "--model", "decodegate", "--tasks", "x"]
    assert lmeval_argv(["run", "--model", "hf"]) == ["run", "--model", "hf"]
    assert lmeval_argv(["--", "ls", "tasks"]) == ["ls", "tasks"]
    assert lmeval_argv(["--config", "c.yaml"]) == ["run", "--config", "c.yaml"]
    assert lmeval_argv([]) == ["--help"]


def test_cli_runs_lm_eval_tasks_through_decodegate(local_tasks_only, tmp_path, capsys):
    rc = main(["lm-eval", "--model_args", "target=tiny-llama,decoder=speculative,draft=tiny-llama,k=3",
               "--include_path", str(LOCAL), "--tasks", f"{GEN},{MC}", "--limit", "2",
               "--output_path", str(tmp_path), "--log_samples"])
    assert rc == 0
    out = capsys.readouterr().out
    assert GEN in out and MC in out and "exact_match" in out and "acc" in out
    samples = list(tmp_path.rglob(f"samples_{GEN}_*.jsonl"))
    assert len(samples) == 1 and len(samples[0].read_text().splitlines()) == 2


def test_cli_bad_input_exits_2(local_tasks_only, capsys):
    rc = main(["lm-eval", "--model_args", "target=tiny-llama", "--include_path", str(LOCAL),
               "--tasks", "no_such_task"])
    assert rc == 2
    assert "Tasks not found: no_such_task" in capsys.readouterr().err
    rc = main(["lm-eval", "--model_args", "target=tiny-llama,kk=3", "--include_path", str(LOCAL),
               "--tasks", GEN, "--limit", "1"])
    assert rc == 2
    assert "unknown model arg 'kk'; did you mean 'k'?" in capsys.readouterr().err


def test_cli_task_data_that_cannot_be_fetched_exits_2(local_tasks_only, tmp_path, monkeypatch, capsys):
    """A task whose dataset is neither cached nor reachable (gsm8k offline, as the README's example
    runs on a fresh machine): before, datasets' ConnectionError was an internal error, exit 3."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (tmp_path / "missing.yaml").write_text((LOCAL / "tiny_gen.yaml").read_text().replace(
        "task: decodegate_tiny_gen", "task: decodegate_missing_data").replace(
        "custom_dataset: !function _local.load\ndataset_kwargs:\n  data_files:\n    test: tiny_gen.jsonl\n",
        "dataset_path: decodegate-tests/no-such-dataset\n"))
    rc = main(["lm-eval", "--model_args", "target=tiny-llama", "--include_path", str(tmp_path),
               "--tasks", "decodegate_missing_data", "--limit", "1"])
    err = capsys.readouterr().err
    assert rc == 2, err[-1500:]
    # (not "Traceback": lm-eval's log handler, bound to an earlier test's captured stream, prints one)
    assert "internal error" not in err and "a task's data could not be loaded" in err and "no-such-dataset" in err


# ----------------------------------------------------------------------------- bad input

def test_unknown_task_is_a_clear_error(tiny_llama, local_tasks_only):
    with pytest.raises(LmEvalError, match="unknown lm-eval task 'decodegate_tiny_gn'.*'decodegate_tiny_gen'"):
        lmeval_records("decodegate_tiny_gn", tiny_llama, "standard", {}, candidate="b",
                       include_path=str(LOCAL))
    assert issubclass(LmEvalError, ValueError) and LmEvalError.__module__ == "harness.run.lmeval"


def test_bad_model_args_are_clear_errors(tiny_llama):
    with pytest.raises(LmEvalError, match="unknown model arg 'kk'; did you mean 'k'"):
        DecodegateLM(target=tiny_llama, kk=3)
    with pytest.raises(LmEvalError, match="target="):
        DecodegateLM(pretrained="gpt2")
    # lm-eval splits model_args on commas: a list must use ';'.
    with pytest.raises(LmEvalError, match="has no name.*exit_layers=4;8;12"):
        lmeval_get_model("decodegate").create_from_arg_string("target=tiny-llama,exit_layers=4,8")
    assert bridge.parse_model_args({"exit_layers": "4;8"})[1] == {"exit_layers": [4, 8]}
    with pytest.raises(LmEvalError, match="k must be an integer"):
        DecodegateLM(target=tiny_llama, decoder="speculative", draft="tiny-llama", k="three")
    with pytest.raises(DecoderError, match="unknown decoder 'specultive'"):
        DecodegateLM(target=tiny_llama, decoder="specultive")
    with pytest.raises(DecoderError, match="takes no option"):
        DecodegateLM(target=tiny_llama, decoder="standard", k=3)


def test_generation_kwargs_our_decoders_cannot_honour(tiny_llama):
    lm = DecodegateLM(target=tiny_llama, decoder="standard")
    eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    with pytest.raises(LmEvalError, match="repetition_penalty cannot be passed"):
        lm._request("Q:", {"until": [], "repetition_penalty": 1.2}, eos)
    with pytest.raises(LmEvalError, match="num_beams"):
        lm._request("Q:", {"until": [], "num_beams": 4}, eos)
    with pytest.raises(LmEvalError, match="max_gen_toks=256 leaves no room"):
        lm._request("Q:", {"until": []}, eos)  # lm-eval's default 256 fills the tiny model's context


def test_unsafe_tasks_need_confirmation(tiny_llama, tmp_path):
    from suites.lmeval_export import export_suites

    export_suites(tmp_path, ["code"], profile="smoke")
    with pytest.raises(LmEvalError, match="confirm_run_unsafe_code"):
        lmeval_records("decodegate_code_smoke", tiny_llama, "standard", {}, candidate="b",
                       include_path=str(tmp_path), limit=1)


# ----------------------------------------------------------------------------- as regress suites

LOSSY_SELF_DRAFT = '''
[[candidates]]
name = "lossy"
decoder = "speculative"
kind = "lossy"
options = { draft = "tiny-llama", k = 3 }
'''


def _regress_lmeval(tmp_path, suites: dict, looks: int = 1) -> tuple[int, dict]:
    """`decodegate regress` on lm-eval suites {name: include_path}, a lossy candidate that happens
    to give the baseline's tokens (speculative, greedy), margin 0.9."""
    cfg = write_regress_config(tmp_path / "regress.toml", candidates=LOSSY_SELF_DRAFT,
                               suites={f"lmeval:{n}": {"margin": 0.9, "include_path": str(p)} for n, p in suites.items()},
                               profile={"subset": "smoke", "suites": [f"lmeval:{n}" for n in suites],
                                        "temperatures": [0.0], "looks": looks})
    code = regress(cfg, tmp_path / "run")
    summary = tmp_path / "run" / "summary.json"
    return code, json.loads(summary.read_text()) if summary.exists() else {}


@pytest.mark.full
def test_lmeval_suite_under_three_looks_decides(tmp_path):
    """The look sets hold the ids the records carry (before: ints 0..n-1 against the records'
    strings, so no look was ever reached and every lm-eval suite was inconclusive)."""
    code, s = _regress_lmeval(tmp_path, {GEN: LOCAL}, looks=3)
    cand = s["candidates"]["lossy"]
    seq = cand["suites"][f"lmeval:{GEN}"]["quality"]["sequential"]
    assert seq["of"] == 3 and seq["looks"] and seq["decided"] == "non-inferior"
    gate = next(g for g in cand["gates"] if g["name"] == f"quality lmeval:{GEN}")
    assert gate["status"] == "pass" and gate["detail"].startswith("non-inferior at look")
    assert code == 0


def test_lmeval_rows_dropped_after_their_marker_run_again(tmp_path):
    """A decoder run again after a fix loses its rows (runner.forget); before, its lm-eval
    markers stayed, so the rerun skipped its tasks and the verdict judged it without them. Now
    forget drops its markers, a marker holds only with the rows it counts, and the rerun fills them."""
    from harness.run.runner import forget
    from harness.verdict.exit_code import exit_code
    code, _ = _regress_lmeval(tmp_path, {GEN: LOCAL})
    assert code == 0
    run = tmp_path / "run"
    rows = lambda: [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]  # noqa: E731
    marks = [json.loads(x) for x in (run / "lmeval_done.jsonl").read_text().splitlines()]
    assert sorted((m["candidate"], m["rows"]) for m in marks) == [("baseline", 5), ("lossy", 5)]
    forget(run, {"lossy"})
    assert not any(r["candidate"] == "lossy" for r in rows())
    assert exit_code(run)[0] == 1
    code, _ = _regress_lmeval(tmp_path, {GEN: LOCAL})
    assert code == 0 and sum(r["candidate"] == "lossy" for r in rows()) == 5


def test_lmeval_task_with_no_docs_fails_with_no_items(tmp_path):
    empty = tmp_path / "tasks"
    empty.mkdir()
    (empty / "_local.py").write_text((LOCAL / "_local.py").read_text())
    (empty / "empty.jsonl").write_text("")
    (empty / "empty.yaml").write_text((LOCAL / "tiny_gen.yaml").read_text()
                                      .replace("decodegate_tiny_gen", "decodegate_empty")
                                      .replace("tiny_gen.jsonl", "empty.jsonl"))
    code, s = _regress_lmeval(tmp_path, {"decodegate_empty": empty})
    assert code == 1  # before: exit 3, lm-eval's IndexError on the empty split
    gate = next(g for g in s["candidates"]["lossy"]["gates"] if g["name"] == "quality lmeval:decodegate_empty")
    assert gate["status"] == "fail" and "no items" in gate["detail"]
    assert s["suites"]["lmeval:decodegate_empty"]["n_items"] == 0



def _regress_with(tmp_path, lmeval_table: str, task: str, capsys) -> tuple[int, str, Path]:
    """`decodegate regress` on an ordinary three-item suite, then lm-eval suite `task` with the
    given table lines: (exit code, stderr, run folder)."""
    rows = [{"suite": "tiny3", "version": "1", "description": "d", "smoke": ["a", "b", "c"],
             "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}}]
    rows += [{"id": k, "prompt": f"Say {k}", "references": [k]} for k in "abc"]
    (tmp_path / "tiny3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = write_regress_config(tmp_path / "regress.toml", candidates="""
[[candidates]]
name = "ee"
decoder = "early-exit"
kind = "lossy"
options = { threshold = 0.5 }
""", suites=f"""[suites.tiny3]
margin = 0.5
path = "tiny3.jsonl"
[suites."lmeval:{task}"]
margin = 0.5
{lmeval_table}""", profile={"subset": "smoke", "suites": ["tiny3", f"lmeval:{task}"], "temperatures": [0.0]})
    capsys.readouterr()
    run_dir = tmp_path / "run"
    code = main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress", "--no-tracking"])
    return code, capsys.readouterr().err, run_dir


def test_lmeval_tasks_are_checked_before_anything_generates(tmp_path, capsys, local_tasks_only):
    """Before: lm-eval tasks were resolved only after every other suite had generated, so a
    misspelt task, a wrong include_path or a code task (never allowed: no config key) ended the run
    at the end, with no summary. Now the pre-flight refuses them first, naming the task and the fix."""
    from suites.lmeval_export import export_suites

    code, err, run_dir = _regress_with(tmp_path, f'include_path = "{LOCAL}"', "decodegate_tiny_gn", capsys)
    assert code == 2 and "unknown lm-eval task 'decodegate_tiny_gn'" in err and "'decodegate_tiny_gen'" in err
    assert not run_dir.exists()  # refused before the run folder, let alone a generation
    code, err, run_dir = _regress_with(tmp_path, f'include_path = "{tmp_path / "nowhere"}"', GEN, capsys)
    assert code == 2 and f"lm-eval task {GEN!r}: include_path" in err and "is not a folder" in err
    assert not run_dir.exists()
    tasks = tmp_path / "tasks"
    export_suites(tasks, ["code"], profile="smoke")
    code, err, run_dir = _regress_with(tmp_path, f'include_path = "{tasks}"', "decodegate_code_smoke", capsys)
    assert code == 2 and "decodegate_code_smoke execute generated code" in err
    assert 'set allow_code = true in the config\'s [suites."lmeval:decodegate_code_smoke"] table' in err
    assert not run_dir.exists()


def test_allow_code_runs_an_lmeval_code_task(tmp_path, capsys):
    from suites.lmeval_export import export_suites

    tasks = tmp_path / "tasks"
    export_suites(tasks, ["code"], profile="smoke")
    table = f'include_path = "{tasks}"\nlimit = 2\nmax_gen_toks = 8\nallow_code = true'
    code, err, run_dir = _regress_with(tmp_path, table, "decodegate_code_smoke", capsys)
    assert code in (0, 1), err
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    assert sum(r["suite"] == "lmeval:decodegate_code_smoke" for r in records) == 4  # 2 docs x 2 decoders
    assert "lmeval:decodegate_code_smoke" in json.loads((run_dir / "summary.json").read_text())["suites"]


def test_allow_code_key_is_checked(tmp_path):
    from harness.config import ConfigError, load_config

    def load(table):
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'target = "tiny-llama"\n[[candidates]]\nname = "c"\ndecoder = "standard"\n'
                       f'{table}\n[profiles.smoke]\nsubset = "smoke"\n')
        return load_config(cfg, "smoke")

    assert load('[suites."lmeval:t"]\nallow_code = true').suites["lmeval:t"].allow_code is True
    assert load('[suites."lmeval:t"]\nmargin = 0.1').suites["lmeval:t"].allow_code is False
    with pytest.raises(ConfigError, match="allow_code must be true or false, got 'yes'"):
        load('[suites."lmeval:t"]\nallow_code = "yes"')
    with pytest.raises(ConfigError, match=r"\[suites.factual\]: allow_code applies to lmeval:<task> suites only"):
        load('[suites.factual]\nallow_code = true')
