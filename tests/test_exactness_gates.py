"""Rejection verifiers broken on purpose fail `decodegate regress` at the shipped smoke settings.

The profile numbers (temperatures, seeds, max_new_tokens, exactness windows and samples, top_p)
and the gates are read from the shipped regress.toml; only the target and the suite are tiny.

Why a bigram model: a tiny *random* model gives a prompt-lookup draft token probability ~0 at
almost every step, so whatever the verifier does with it changes nothing measurable (the
correction drawn from p equals the correction drawn from the residual when p(d) = 0). A target
whose next token depends on the last token (attention and MLP outputs zeroed; each token prefers
two successors) repeats bigrams, so prompt lookup proposes tokens the target finds likely: the
verifier's accept test, its residual and its bonus token all matter, as on real text. The model
draft is the same bigram model at a flatter temperature (its q differs from p everywhere).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import decoders.speculative as spec
from decoders import GenerationRequest, make_decoder
from decoders.verify import Verdict, sample_inverse_cdf, verify_rejection
from harness.cli import main
from harness.models import LoadedModel, build_tiny
import helpers
from helpers import SHIPPED, shipped_smoke, write_regress_config

N_ITEMS = 8
PROMPTS = [f"Item {i}: tell me about {w}" for i, w in
           enumerate(["cats", "rivers", "stars", "bread", "music", "trains", "maps", "clouds"])]


def bigram(a: float = 0.7, b: float = 0.55, scale: float = 6.0, seed: int = 0) -> LoadedModel:
    """tiny-llama rewired into a bigram model: token x prefers successors s1(x), s2(x)."""
    loaded = build_tiny("llama")
    m = loaded.model
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        m.model.norm.weight.fill_(1.0)
        v, h = m.lm_head.weight.shape
        emb = torch.randn(v, h, generator=g)
        m.model.embed_tokens.weight.copy_(emb)
        unit = emb / emb.norm(dim=1, keepdim=True)
        first = torch.randperm(v - 3, generator=g) + 3   # successors are byte tokens, never specials
        second = torch.randperm(v - 3, generator=g) + 3
        w = torch.zeros(v, h)
        w.index_add_(0, torch.cat([first[:3], first])[:v], a * unit)
        w.index_add_(0, torch.cat([second[:3], second])[:v], b * unit)
        m.lm_head.weight.copy_(w / h ** 0.5 * scale)
    return LoadedModel("tiny-bigram", m, loaded.tokenizer, loaded.device, loaded.dtype)


# ------------------------------------------------------------------ broken rejection verifiers


def resample_from_p(p, q, draft, u_accept, u_sample):
    """The correction after a rejection drawn from p instead of the residual."""
    v = verify_rejection(p, q, draft, u_accept, u_sample)
    rows = p.gather(1, v.accepted[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
    return Verdict(v.accepted, sample_inverse_cdf(rows, u_sample.gather(1, v.accepted[:, None])[:, 0]))


def accept_inverted(p, q, draft, u_accept, u_sample):
    """The accept test inverted: d kept when u q(d) >= p(d)."""
    k = draft.shape[1]
    p_d = p[:, :k].gather(-1, draft[..., None])[..., 0]
    q_d = torch.ones_like(p_d) if q is None else q.gather(-1, draft[..., None])[..., 0]
    keep = u_accept * q_d >= p_d
    return verify_rejection(p, q, draft, torch.where(keep, 0.0, 1.0).to(u_accept.dtype), u_sample)


def accept_all(p, q, draft, u_accept, u_sample):
    """Every draft token kept, the bonus from row K."""
    k = draft.shape[1]
    return Verdict(torch.full((draft.shape[0],), k, dtype=torch.long), sample_inverse_cdf(p[:, k], u_sample[:, k]))


def shared_uniform(p, q, draft, u_accept, u_sample):
    """The accept test's uniform reused for the correction draw."""
    u = u_sample.clone()
    u[:, :-1] = u_accept
    return verify_rejection(p, q, draft, u_accept, u)


def bonus_wrong_row(p, q, draft, u_accept, u_sample):
    """After K acceptances the bonus token drawn from row K-1 instead of row K."""
    k = draft.shape[1]
    return verify_rejection(torch.cat([p[:, :k], p[:, k - 1:k]], dim=1), q, draft, u_accept, u_sample)


def residual_unclamped(p, q, draft, u_accept, u_sample):
    """The residual p - q sampled without max(., 0)."""
    saved = torch.Tensor.clamp_min
    torch.Tensor.clamp_min = lambda self, m: self
    try:
        return verify_rejection(p, q, draft, u_accept, u_sample)
    finally:
        torch.Tensor.clamp_min = saved


def target_at_temperature_one(p, q, draft, u_accept, u_sample):
    """The verifier's p not tempered (T = 0.7 undone on the nucleus): p^0.7, renormalised."""
    flat = p.pow(0.7)
    return verify_rejection(flat / flat.sum(-1, keepdim=True), q, draft, u_accept, u_sample)


def q_ignored(p, q, draft, u_accept, u_sample):
    """The point-mass shortcut applied to every draft: accept with p(d), residual p without d.
    Correct for prompt lookup (its q is a point mass): a bug only with a model draft."""
    return verify_rejection(p, None, draft, u_accept, u_sample)


BROKEN = [resample_from_p, accept_inverted, accept_all, shared_uniform, bonus_wrong_row, residual_unclamped,
          target_at_temperature_one, q_ignored]
# (bug, drafter) pairs where the bug changes no output distribution at all
HARMLESS = {("q_ignored", "lookup")}


# ------------------------------------------------------------------------------ the smoke run


@pytest.fixture(scope="module")
def smoke_config(tmp_path_factory):
    """A config with the shipped smoke profile and gates, on the bigram target, and a run folder
    holding the baseline's records (each broken run reuses them: only candidates regenerate)."""
    root = tmp_path_factory.mktemp("exactness")
    target = bigram()
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    draft = bigram(scale=6.0 * 0.6)
    draft.model.save_pretrained(root / "draft")
    draft.tokenizer.save_pretrained(root / "draft")
    dec = make_decoder("standard", target)
    rows = [{"suite": "echo", "version": "1", "description": "bigram echo suite for tests",
             "smoke": [f"e{i}" for i in range(N_ITEMS)],
             "defaults": {"grader": "contains", "max_new_tokens": 64, "stop": []}}]
    for i, prompt in enumerate(PROMPTS[:N_ITEMS]):
        text = dec.generate(GenerationRequest(tuple(target.encode(prompt)), max_new_tokens=12,
                                              stop_token_ids=target.stop_token_ids())).text
        rows.append({"id": f"e{i}", "prompt": prompt, "references": [" ".join(text.split()) or "\u0000never"],
                     "grader_options": {"case_sensitive": True}, "categories": ["echo"]})
    (root / "echo.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    profile = {"subset": "smoke", "suites": ["echo"], "sample_suites": ["echo"],
               **shipped_smoke("temperatures", "seeds", "max_new_tokens", "exactness_prompts", "exactness_samples")}
    return write_regress_config(root / "regress.toml", target=root / "target", head={"top_p": SHIPPED["top_p"]},
                                candidates=f"""
[[candidates]]
name = "lookup"
decoder = "speculative"
options = {{ draft = "prompt-lookup", k = 4, verify = "rejection" }}
[[candidates]]
name = "model"
decoder = "speculative"
options = {{ draft = "{root / 'draft'}", k = 3, verify = "rejection" }}
""", suites={"echo": {"margin": 0.1, "path": str(root / "echo.jsonl")}}, profile=profile, gates=SHIPPED["gates"])


def regress(cfg: Path, run_dir: Path) -> dict:
    helpers.regress(cfg, run_dir)
    return helpers.summary(run_dir)


@pytest.fixture(scope="module")
def clean_run(smoke_config, tmp_path_factory):
    run = tmp_path_factory.mktemp("clean") / "run"
    return run, regress(smoke_config, run)


def test_the_correct_verifier_passes_and_is_exercised(clean_run):
    _, summary = clean_run
    for name in ("lookup", "model"):
        cand = summary["candidates"][name]
        assert cand["verdict"] == "pass", [g for g in cand["gates"] if g["status"] != "pass"]
        pit = cand["exactness"]["pit"]
        assert pit["subsets"]["all"]["n"] >= 1000 and pit["subsets"]["rejected"]["n"] >= 50
        assert pit["control"]["pvalue"] > 0.01
        window = cand["exactness"]["tests"][0]
        assert window["rejected"] > 0 and window["detectable_tv"] is not None  # chosen where drafts are turned down


def _baseline_only(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst)
    rows = [json.loads(x) for x in (dst / "records.jsonl").read_text().splitlines()]
    (dst / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["candidate"] == "baseline"))
    for f in ("exactness.jsonl", "summary.json"):
        (dst / f).unlink(missing_ok=True)


# `make check` keeps one corner of the grid (each case is a regress at the shipped smoke settings,
# 8-16 s quiet): the bug that is harmless with prompt lookup and caught with a model draft, so one
# broken verifier fails end to end and one harmless pair passes. The other seven are `full`;
# tests/test_verify.py's distribution test catches accept-all, a wrong bonus row and the
# correction drawn from p in milliseconds, test_speculative.py on whole generations.
QUICK = {"q_ignored"}


@pytest.mark.parametrize("bug", [pytest.param(b, marks=() if b.__name__ in QUICK else pytest.mark.full)
                                 for b in BROKEN], ids=lambda f: f.__name__)
def test_broken_rejection_verifier_fails(bug, smoke_config, clean_run, tmp_path, monkeypatch):
    _baseline_only(clean_run[0], tmp_path / "run")
    monkeypatch.setattr(spec, "verify_rejection", bug)
    summary = regress(smoke_config, tmp_path / "run")
    for name in ("lookup", "model"):
        cand = summary["candidates"][name]
        caught = [g["name"] for g in cand["gates"] if g["status"] == "fail" and g["name"].startswith("exactness")]
        if (bug.__name__, name) in HARMLESS:
            assert cand["verdict"] == "pass", caught
        else:
            assert caught, f"{bug.__name__} with the {name} draft passed every exactness gate"


# `full`: a regress at the smoke settings (13 s quiet). `make check` keeps the two halves:
# test_exactness_reference.py (the same bug leaves the reference alone; a failing control names
# the harness's sampler).
@pytest.mark.full
def test_a_top_p_bug_in_the_shared_sampler_is_named(smoke_config, tmp_path, monkeypatch):
    """A bug in `decoders.sampling` (which the baseline and both candidates sample with) fails the
    run, and the verdict names the harness's sampler: the reference does not share that code."""
    from tests.test_exactness_reference import shortcut_bug
    import decoders.sampling as sampling

    monkeypatch.setattr(sampling, "_top_p_only", shortcut_bug)
    run = tmp_path / "run"
    assert main(["regress", "--config", str(smoke_config), "--run-dir", str(run), "--no-progress",
                 "--no-tracking"]) == 1
    summary = json.loads((run / "summary.json").read_text())
    for name in ("lookup", "model"):
        cand = summary["candidates"][name]
        assert cand["verdict"] == "fail"
        control = next(g for g in cand["gates"] if g["name"] == "exactness control")
        assert control["status"] == "fail" and "harness's sampler is wrong" in control["detail"], control
        assert "decoders.sampling" in control["detail"]
