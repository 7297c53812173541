"""The hot routes' valid requests served without FastAPI's per-request machinery.

For a one-sentence request FastAPI's routing, dependency solving (an AsyncExitStack per request),
``json.loads`` and validation of the Python objects, and its response classes cost more CPU than the
model does; on two cores that CPU is taken from the encoder. This middleware sits inside every
other one (metrics, the 500 guard, the key check and the body limit still see each request) and
answers a POST to a route of ``FAST_ROUTES`` (the embedding routes and /search) whose body pydantic
validates straight from JSON, with the same content function the route calls. Anything else
(another path or method, another content type, a body that does not validate, a key check still to
do) goes on to FastAPI untouched, so every error keeps the status and message it had
(docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from distilembed.errors import UserError
from service.auth import GRANTED
from service.errors import ApiError, user_error_json
from service.middleware import error_json
from service.routes_embed import openai_content, tei_content
from service.routes_index import search_content
from service.schemas import EmbeddingRequest, EmbedRequest, SearchRequest
from service.state import ServiceState

Content = Callable[[Any, ServiceState, Scope], Awaitable[Any]]
# path -> (request model, content): what is served here without FastAPI
FAST_ROUTES: dict[str, tuple[type[BaseModel], Content]] = {
    "/v1/embeddings": (EmbeddingRequest, openai_content),
    "/embed": (EmbedRequest, tei_content),
    "/search": (SearchRequest, search_content),
}

JSON_TYPES = (b"application/json",)
HEADERS = [(b"content-type", b"application/json")]


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";")[0].strip().lower() in JSON_TYPES
    return False


class FastPathMiddleware:
    def __init__(
        self, app: ASGIApp, state: ServiceState, routes: Mapping[str, BaseRoute], keys: bool
    ) -> None:
        """``routes``: the FastAPI route of each fast path, for the metrics' route label; ``keys``:
        whether a request must have passed the key check (AccessMiddleware) to be served here."""
        self.app, self.state, self.routes, self.keys = app, state, routes, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        http_post = scope["type"] == "http" and scope["method"] == "POST"
        fast = FAST_ROUTES.get(scope["path"]) if http_post else None
        if fast is None or not _is_json(scope) or (self.keys and not scope.get("state", {}).get(GRANTED)):
            await self.app(scope, receive, send)
            return
        message = await receive()  # PayloadLimitMiddleware hands over the whole body in one message
        if message["type"] != "http.request" or message.get("more_body", False):
            await self.app(scope, _replay(message, receive), send)
            return
        model, content = fast
        try:
            body = model.model_validate_json(message.get("body", b""))
        except Exception:  # any failure to validate: FastAPI answers it, as it always has
            await self.app(scope, _replay(message, receive), send)
            return
        scope["route"] = self.routes[scope["path"]]
        try:
            payload = orjson.dumps(await content(body, self.state, scope), option=orjson.OPT_SERIALIZE_NUMPY)
        except ApiError as exc:
            await error_json(scope, exc.status, exc.message, exc.kind, exc.headers)(scope, receive, send)
            return
        except UserError as exc:  # from the index layer, as errors.install answers it
            await user_error_json(scope, exc)(scope, receive, send)
            return
        headers = [*HEADERS, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _replay(first: Message, receive: Receive) -> Receive:
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
