"""An HTTP server with the OpenAI API shape over the engine: `python -m reference serve`.

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (plain or streamed as
server-sent events). The engine runs on its own thread (engine_loop.EngineLoop); handlers run on
uvicorn's asyncio loop and only submit, wait and abort, so a request that arrives while others
decode joins the running batch, and no request waits for another to finish. A client that
disconnects has its request aborted. A bad request gets a 400 and a bad route a 404, both with
an OpenAI-shaped body (openai_api.APIError).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from reference.engine.engine_loop import EngineLoop, Progress
from reference.engine.openai_api import (APIError, ChatRequest, ChatShape, CompletionRequest,
                                         CompletionShape, IncrementalText, SamplingFields,
                                         chat_prompt, sse, usage, validation_message)
from reference.engine.params import SamplingParams

DISCONNECT_POLL_S = 0.2        # how often a non-streamed request checks that its client is there


def build_app(llm, model_name: str) -> FastAPI:
    """The FastAPI app serving `llm` (a reference.engine.LLM) under the name `model_name`."""
    engine_loop = EngineLoop(llm.engine)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_loop.start()
        yield
        engine_loop.stop()

    app = FastAPI(title="reference engine", lifespan=lifespan)
    app.state.engine_loop = engine_loop

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, err: RequestValidationError):
        message, field = validation_message(err.errors())
        return await api_error(request, APIError(message, param=field))

    @app.exception_handler(Exception)
    async def server_error(request: Request, err: Exception):   # a bug: say so in the same shape
        return JSONResponse(APIError(f"internal error: {type(err).__name__}: {err}", 500,
                                     kind="server_error").body(), status_code=500)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(
                       err.status_code, str(err.detail))
        return JSONResponse(APIError(message, err.status_code).body(), status_code=err.status_code)

    def sampling(body: SamplingFields, max_tokens: int):
        if body.model != model_name:
            raise APIError(f"the model {body.model!r} does not exist: this server serves "
                           f"{model_name!r}", param="model", code="model_not_found")
        if body.n != 1:
            raise APIError(f"n={body.n} is not supported: one completion per request (n=1)",
                           param="n")
        try:
            return SamplingParams(temperature=body.temperature, top_p=body.top_p,
                                  top_k=body.top_k, max_tokens=max_tokens, seed=body.seed,
                                  stop=body.stop)
        except (ValueError, TypeError) as err:
            raise APIError(str(err)) from None

    async def start(prompt, params, watch: ClientWatch, prefix: str):
        """Submit and wait for the first progress (so a rejected request still gets a 4xx)."""
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        try:
            updates = await engine_loop.submit(prompt, params, request_id)
            first = await next_progress(updates, watch)
        except (ValueError, TypeError) as err:   # add_request refused it
            raise APIError(str(err)) from None
        except BaseException:
            engine_loop.abort(request_id)
            raise
        if first.finish_reason == "error":
            raise failure(first)
        return request_id, updates, first

    async def next_progress(updates: asyncio.Queue, watch: ClientWatch) -> Progress:
        while True:
            try:
                progress = await asyncio.wait_for(updates.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                progress = None
            if await watch.gone():   # nobody reads the answer
                raise APIError("the client disconnected", 499, kind="client_closed")
            if progress is not None:
                return progress

    async def respond(body, prompt, params, request: Request, chat: bool):
        watch = ClientWatch(request)
        request_id, updates, progress = await start(prompt, params, watch,
                                                    "chatcmpl" if chat else "cmpl")
        shape = ChatShape() if chat else CompletionShape()
        text = IncrementalText([body.stop] if isinstance(body.stop, str)
                               else body.stop or [])
        head = {"id": request_id, "created": int(time.time()), "model": model_name}
        if not body.stream:
            try:
                while not progress.finished:
                    progress = await next_progress(updates, watch)
            finally:
                if not progress.finished:
                    engine_loop.abort(request_id)
            if progress.finish_reason == "error":
                raise failure(progress)
            return {**head, "object": shape.whole, "usage": usage(progress),
                    "choices": [shape.choice(text.delta(progress), progress.finish_reason)]}
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(events(head, shape, text, progress, updates, request_id,
                                        include_usage), media_type="text/event-stream")

    async def events(head, shape, text, progress, updates, request_id,
                     include_usage) -> AsyncIterator[str]:
        try:
            if shape.first_delta is not None:
                yield sse({**head, "object": shape.chunk, "choices": [shape.delta_choice(
                    shape.first_delta, None)]})
            while True:
                if progress.finish_reason == "error":
                    yield sse(failure(progress).body())
                    return
                piece = text.delta(progress)
                if piece or progress.finished:
                    yield sse({**head, "object": shape.chunk, "choices": [shape.delta_choice(
                        {shape.text_key: piece} if piece else {},
                        progress.finish_reason if progress.finished else None)]})
                if progress.finished:
                    break
                progress = await updates.get()
            if include_usage:
                yield sse({**head, "object": shape.chunk, "choices": [], "usage": usage(progress)})
            yield "data: [DONE]\n\n"
        finally:
            if not progress.finished:   # the client went away: stop spending steps on it
                engine_loop.abort(request_id)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": created, "owned_by": "reference"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await respond(body, body.prompt, sampling(body, body.max_tokens), request, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        prompt = chat_prompt(llm.tokenizer, [m.turn() for m in body.messages])
        max_tokens = next((n for n in (body.max_completion_tokens, body.max_tokens)
                           if n is not None), None)
        if max_tokens is None:   # as vLLM: the rest of the context window
            max_tokens = max(llm.engine.config.max_seq_len - len(prompt), 1)
        return await respond(body, prompt, sampling(body, max_tokens), request, True)

    return app


class ClientWatch:
    """Asks at most every DISCONNECT_POLL_S whether a request's client has gone away (a streamed
    response learns it from Starlette, which cancels the stream)."""

    def __init__(self, request: Request):
        self.request, self.checked = request, time.monotonic()

    async def gone(self) -> bool:
        if time.monotonic() - self.checked < DISCONNECT_POLL_S:
            return False
        self.checked = time.monotonic()
        return await self.request.is_disconnected()


def failure(progress: Progress) -> APIError:
    """The error of a request that ended with finish_reason "error": its own fault (400) or the
    engine's (500)."""
    if progress.server_fault:
        return APIError(progress.error or "the engine failed", 500, kind="server_error")
    return APIError(progress.error or "the request was rejected")


def serve(args) -> None:
    """Run the server until interrupted (args: the `serve` options of reference/__main__.py)."""
    import uvicorn

    from reference.engine import LLM
    from reference.threads import configure

    llm = LLM(model=args.model, block_size=args.block_size, num_blocks=args.num_blocks,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=not args.no_prefix_caching, scheduling=args.scheduling,
              attention=args.attention, device=args.device, backend=args.backend)
    configure(args.threads)   # once the knobs are known to be good: the cores free now
    uvicorn.run(build_app(llm, args.model), host=args.host, port=args.port, log_level="info")
