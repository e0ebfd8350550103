"""JSON for people's scripts (`--json`): every number finite. A value that is not (an
infinite rate from a step of 1e-300 s, a NaN an exporter sent) is null, and the
document says why under `not_finite` (its path -> `inf`, `-inf` or `nan`), since
`Infinity` and `NaN` are not JSON and break the reader that trusted us."""

from __future__ import annotations

import json
import math
from typing import Any


def _finite(value: Any, path: str, why: dict[str, str]) -> Any:
    t = type(value)
    if t is float:
        if math.isfinite(value):
            return value
        why[path] = str(value)
        return None
    if t is dict:
        return {k: _finite(v, f"{path}.{k}" if path else str(k), why)
                for k, v in value.items()}
    if t in (list, tuple):
        return [_finite(v, f"{path}[{i}]", why) for i, v in enumerate(value)]
    return value


def dumps(doc: Any, indent: int | None = None, sort_keys: bool = False) -> str:
    """`doc` as JSON with non-finite numbers made null and said (see above)."""
    why: dict[str, str] = {}
    out = _finite(doc, "", why)
    if why and isinstance(out, dict):
        out["not_finite"] = why
    return json.dumps(out, indent=indent, sort_keys=sort_keys, allow_nan=False)
