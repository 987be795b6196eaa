"""A model's context length, read from its config: the one fact about a model that the cache
(`decoders.kv`), the fast path (`decoders.lean`) and the backends' shared pieces
(`decoders.common`) all need. It sits below all three so that none of them imports another
to get it (they would form a circle: common -> lean -> kv -> common).
"""
from __future__ import annotations


def context_length(model) -> int | None:
    """The most positions `model` can attend to, or None when its config does not say."""
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        n = getattr(cfg, name, None)
        if n:
            return int(n)
    return None
