"""Results as plain JSON data: dataclasses to dicts, numpy scalars to Python, non-finite floats
to null (NaN) or a huge finite number (infinity), so summaries and reports are valid JSON."""
from __future__ import annotations

import dataclasses
import math


def plain(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else (1e308 if obj > 0 else -1e308)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return plain(obj.item())
    return obj
