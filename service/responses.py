"""JSON responses serialised by orjson: numpy arrays go out directly, float32 at float32 precision.

For a 128-d vector this is ~20x faster than ``vectors.tolist()`` + ``json.dumps`` (which writes every
float32 at float64 precision, ~70% more bytes); on the one-sentence hot path that is a few percent
of a request's CPU time.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse

OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=OPTIONS)
