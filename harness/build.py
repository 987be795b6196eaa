"""Turn decoder names and option dicts (from the CLI or a config) into ready decoders.

The only place where a `draft` option naming a model is loaded, so that `decoders/` never
imports `harness/`. Loaded models are cached per (spec, device) within a process.
"""
from __future__ import annotations

from decoders import make_decoder
from harness.models import LoadedModel, load_model

# Drafts that are not models: the speculative backend understands these strings itself.
NON_MODEL_DRAFTS = ("prompt-lookup",)

_MODELS: dict[tuple[str, str | None], LoadedModel] = {}


def get_model(spec: str, device: str | None = None) -> LoadedModel:
    key = (spec, device)
    if key not in _MODELS:
        _MODELS[key] = load_model(spec, device=device)
    return _MODELS[key]


def is_model_draft(draft: str) -> bool:
    return not (draft in NON_MODEL_DRAFTS or draft.startswith("self:"))


def build_decoder(name: str, target: LoadedModel, options: dict | None = None, engines: dict | None = None):
    """`options` holds decoder options; `draft` may name a model (loaded here), 'prompt-lookup',
    or 'self:L' (the target's first L layers). `draft_device` places a draft model. `engine`
    names a started server from `engines` (the config's [engines], see harness.run.engines)."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    if isinstance(options.get("engine"), str):
        from harness.config import ConfigError
        if not engines or options["engine"] not in engines:
            raise ConfigError(f"decoder {name!r}: engine {options['engine']!r} is not running "
                              f"(known: {', '.join(sorted(engines or {})) or 'none'})")
        options["engine"] = engines[options["engine"]]
    draft = options.get("draft")
    draft_device = options.pop("draft_device", None)
    if isinstance(draft, str) and is_model_draft(draft):
        if draft == target.name and draft_device in (None, str(target.device)):
            options["draft"] = target  # the target as its own draft: share, do not load twice
        else:
            options["draft"] = get_model(draft, draft_device or str(target.device))
    return make_decoder(name, target, **options)
