"""The gateway's HTTP routes: each parses its API's body, admits one call and answers it."""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from talariad.calls.dialects import chat, completions, messages, responses
from talariad.calls.errors import APIError
from talariad.calls.routes import ROUTES
from talariad.config import ModelConfig
from talariad.gateway import errors, limits
from talariad.gateway.auth import APIKeys
from talariad.gateway.call import Call, JSONBody, respond
from talariad.gateway.dialects import chat as chat_answer
from talariad.gateway.dialects import completions as completions_answer
from talariad.gateway.dialects import messages as messages_answer
from talariad.gateway.dialects import responses as responses_answer
from talariad.gateway.gateway import Gateway
from talariad.gateway.metrics import Children
from talariad.httpserver import fastapi_app, post_json
from talariad.wire.box import AGE_HEADER, SNAPSHOT_PATH, STREAM_TYPE

__all__ = ["Gateway", "build_app", "metrics_app"]


class _CountResponses:
    """Count responses by status code (a bare ASGI wrapper: no per-request task or body copy)."""

    def __init__(self, app, counter):
        self.app, self.codes = app, Children(counter)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":
                self.codes.get(str(message["status"])).inc()
            await send(message)

        return await self.app(scope, receive, counted)


def build_app(gw: Gateway, metrics: bool = True) -> FastAPI:
    """The HTTP endpoint; `metrics` False leaves `/metrics` to `metrics_app` on a port of its
    own (`listen.metrics`)."""
    app = fastapi_app(title="Talaria", docs_url=None, redoc_url=None)
    errors.install(app)
    app.add_middleware(_CountResponses, counter=gw.metrics.responses)
    app.add_middleware(limits.BodyLimit, max_bytes=lambda: gw.cfg.limits.max_body_bytes)
    app.add_middleware(APIKeys, keys=lambda: gw.api_keys)
    # routes match in the order they are added: the calls first, the probes after
    _call_routes(app, gw)
    _probe_routes(app, gw)
    if metrics:
        _metrics_route(app, gw)
    _model_routes(app, gw)
    _pool_routes(app, gw)
    return app


def _call_routes(app: FastAPI, gw: Gateway) -> None:
    """The call paths of `calls.routes` (the picker's too), each answered by the endpoint of its
    body model; then count_tokens, which is no call."""

    async def chat_completions(body: chat.ChatCompletionRequest, request: Request) -> Response:
        call = Call(gw, chat.spec(body), body, request.headers, await request.body())
        return await respond(call, chat_answer.stream, chat_answer.body)

    async def text_completions(body: completions.CompletionRequest, request: Request) -> Response:
        call = Call(gw, completions.spec(body), body, request.headers, await request.body())
        return await respond(call, completions_answer.stream, completions_answer.body)

    async def create_message(body: messages.MessagesRequest, request: Request) -> Response:
        """Anthropic Messages; `?beta=true`, `anthropic-version` and the API key are accepted and ignored."""
        call = Call(gw, messages.spec(body), body, request.headers, await request.body())
        gw.log_dropped(call.session, body.dropped_tools())
        return await respond(call, messages_answer.stream, messages_answer.body)

    async def create_response(body: responses.ResponsesRequest, request: Request) -> Response:
        """OpenAI Responses (Codex): one respond path with chat, Responses shapes and events."""
        spec, turn = responses.spec(body, gw.stored)
        call = Call(gw, spec, body, request.headers, await request.body())
        gw.log_dropped(call.session, turn.tools.dropped)
        stream, full = responses_answer.stream, responses_answer.body
        return await respond(call, partial(stream, turn), partial(full, turn))

    endpoints = {
        chat.ChatCompletionRequest: chat_completions,
        completions.CompletionRequest: text_completions,
        messages.MessagesRequest: create_message,
        responses.ResponsesRequest: create_response,
    }
    for path, route in ROUTES.items():
        post_json(app, path)(endpoints[route.body])

    @post_json(app, "/v1/messages/count_tokens")
    async def count_tokens(body: messages.CountTokensRequest, request: Request) -> Response:
        """The exact prompt length (system, messages and tools) as the serving model tokenizes it."""
        req = messages_answer.count_request(gw, body, await request.body())
        for inst in gw.cfg.instances:
            if req.model in inst.models and gw.ready(inst.name):
                count = await gw.directory.client.count_tokens(inst.name, req)
                if isinstance(count, int):
                    return JSONBody({"input_tokens": count})
                if isinstance(count, str):
                    raise APIError(400, count, param="messages")
        raise APIError(
            503,
            f"no instance of {req.model!r} is ready to count tokens",
            type="api_error",
            code="instance_unavailable",
            headers={"Retry-After": "1"},
        )


def _probe_routes(app: FastAPI, gw: Gateway) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness: answered while the daemon's loop runs (readiness is /ready)."""
        rows = gw.describe()
        return JSONResponse(
            {
                "status": "ok",
                "instances_ready": [r["name"] for r in rows if r["ready"]],
                "instances": rows,
            }
        )

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 when every configured model has an instance that takes its calls;
        `unavailable` says why each other model has none."""
        found = {m.name: gw.availability(m.name) for m in gw.cfg.models}
        unavailable = {m: a.why for m, a in found.items() if a.why is not None}
        return JSONResponse(
            {
                "status": "not_ready" if unavailable else "ready",
                "models": {m: a.takers for m, a in found.items()},
                "unavailable": unavailable,
                "instances": gw.describe(),
            },
            status_code=503 if unavailable else 200,
        )


def metrics_app(gw: Gateway) -> FastAPI:
    """`/metrics` alone, for `listen.metrics`."""
    app = fastapi_app(title="Talaria metrics", docs_url=None, redoc_url=None)
    errors.install(app)
    _metrics_route(app, gw)
    return app


def _metrics_route(app: FastAPI, gw: Gateway) -> None:
    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _model_routes(app: FastAPI, gw: Gateway) -> None:
    @app.get("/v1/models")
    async def models() -> dict:
        """Every model and every exact alias, each an id a client can send; glob aliases are no
        ids, so they are only described, in their model's `alias_patterns`."""
        data = []
        for m in gw.cfg.models:
            entry = _model_entry(gw, m)
            data.append(entry)
            data += [{**entry, "id": a, "alias_of": m.name} for a in entry["aliases"]]
        return {"object": "list", "data": data}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict:
        """One id, resolved as a call would resolve it (a name, an exact alias, a glob; for an
        Anthropic client, the configured default model last), or 404."""
        api = "anthropic" if "anthropic-version" in request.headers else "openai"
        m = gw.resolve(model_id, api)
        entry = _model_entry(gw, m)
        return entry if model_id == m.name else {**entry, "id": model_id, "alias_of": m.name}


def _pool_routes(app: FastAPI, gw: Gateway) -> None:
    @app.get(SNAPSHOT_PATH)
    async def pool_snapshot(request: Request) -> Response:
        """The box's snapshot for the pool's endpoint picker (`pool.token_file`'s bearer token)."""
        gw.pool.authorize(request.headers.get("authorization"))
        since = request.query_params.get("since", "")
        token = int(since) if since.isdigit() else None  # anything else: the whole view
        etag = request.headers.get("if-none-match")
        hold_s = _hold_s(request.query_params.get("wait"))
        if request.query_params.get("stream") == "1":  # the held polls' answers, as frames
            gap_s = min(_hold_s(request.query_params.get("gap")), MAX_STREAM_GAP_S)
            frames = gw.pool.stream(gw, token, etag, max(hold_s, MIN_STREAM_HOLD_S), gap_s)
            return StreamingResponse(frames, media_type=STREAM_TYPE)
        got = await gw.pool.answer_held(gw, token, etag, hold_s)
        if isinstance(got, float):  # the caller holds what the box would send but its age
            return Response(status_code=304, headers={"etag": etag or "", AGE_HEADER: f"{got:.6f}"})
        return Response(
            got.model_dump_json(), media_type="application/json", headers={"etag": got.etag or ""}
        )


MAX_HOLD_S = 5.0
"""The longest a box holds a conditional snapshot poll (`?wait=`)."""
MIN_STREAM_HOLD_S = 0.1
"""The shortest gap between a snapshot stream's age frames (`?stream=1&wait=`): what keeps an
idle box's stream from spinning."""
MAX_STREAM_GAP_S = 1.0
"""The longest a snapshot stream waits after a snapshot frame before the next (`?gap=`)."""


def _hold_s(wait: str | None) -> float:
    """`?wait=SECONDS`, within [0, MAX_HOLD_S]; anything else: 0, answered at once."""
    try:
        held = float(wait or 0)
    except ValueError:
        return 0.0
    return min(held, MAX_HOLD_S) if held > 0 else 0.0  # NaN: not > 0


def _model_entry(gw: Gateway, m: ModelConfig) -> dict:
    exact = [a for a in m.aliases if not any(c in a for c in "*?[")]
    return {
        "id": m.name,
        "object": "model",
        "type": "model",  # the Anthropic models API's field
        "display_name": m.name,
        "created": 0,
        "created_at": "1970-01-01T00:00:00Z",
        "owned_by": "talaria",
        "max_model_len": m.max_context,
        "status": gw.residency(m.name),
        "aliases": exact,
        "alias_patterns": [a for a in m.aliases if a not in exact],
    }
