"""An HTTP server with the OpenAI API shape over the engine: `python -m reference serve`.

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (plain or streamed as
server-sent events). One thread, `EngineLoop`, owns the engine (which is not thread-safe) and
calls `engine.step()` while any request is unfinished. Handlers run on uvicorn's asyncio loop:
they hand new requests and aborts to that thread through a thread-safe queue, and it hands each
request's progress back through the request's own asyncio.Queue (`loop.call_soon_threadsafe`).
A request that arrives while others decode joins the running batch at the next step; a client
that disconnects has its request aborted. Errors are OpenAI-shaped JSON:
`{"error": {"message", "type", "param", "code"}}`, 400 for a bad request, 404 for a bad route.
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

log = logging.getLogger("reference.engine.server")
DEFAULT_CHAT_MAX_TOKENS = 256  # a chat request without max_tokens (completions default to 16)
DISCONNECT_POLL_S = 0.5        # how often a non-streamed request checks that its client is there


@dataclass(frozen=True)
class Progress:
    """A copy of one RequestOutput, made on the engine thread (token_ids are cumulative)."""
    prompt_tokens: int
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    text: str           # the engine's final text; used once finished
    error: str | None


class EngineLoop:
    """The one thread that touches the engine: adds, aborts and steps, in that order."""

    def __init__(self, engine):
        self.engine = engine
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.listeners: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Finish the loop: requests still in flight end with an error; joins the thread."""
        self.commands.put(None)
        self.thread.join()

    async def submit(self, prompt: str | list[int], params, request_id: str) -> asyncio.Queue:
        """Add a request; returns the queue its Progress arrives on. Raises what add_request raises."""
        loop = asyncio.get_running_loop()
        accepted, updates = loop.create_future(), asyncio.Queue()
        self.commands.put(("add", request_id, prompt, params, time.perf_counter(),
                           loop, accepted, updates))
        await accepted
        return updates

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def _run(self) -> None:
        while True:
            wait = not self.engine.has_unfinished()   # sleep on the queue only when idle
            try:
                while True:
                    command = self.commands.get(block=wait)
                    wait = False
                    if command is None:
                        self._fail_all("the server is shutting down")
                        return
                    self._apply(command)
            except queue.Empty:
                pass
            if self.engine.has_unfinished():
                self._step()

    def _apply(self, command: tuple) -> None:
        if command[0] == "abort":
            if self.listeners.pop(command[1], None) is not None:
                self.engine.abort(command[1])
            return
        _, request_id, prompt, params, arrival, loop, accepted, updates = command
        try:
            self.engine.add_request(prompt, params, request_id=request_id, arrival_time=arrival)
        except Exception as err:  # noqa: BLE001 - handed to the handler, which answers 400/500
            loop.call_soon_threadsafe(settle, accepted, err)
            return
        self.listeners[request_id] = (loop, updates)
        loop.call_soon_threadsafe(settle, accepted, None)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as err:  # noqa: BLE001 - a broken step fails its requests, not the server
            log.exception("engine step failed")
            self._fail_all(f"engine step failed: {type(err).__name__}: {err}")
            return
        for out in outputs:
            listener = self.listeners.get(out.request_id)
            if listener is None:
                continue
            if out.finished:
                del self.listeners[out.request_id]
            self._send(listener, Progress(len(out.prompt_token_ids), list(out.token_ids),
                                          out.finished, out.finish_reason, out.text, out.error))

    def _fail_all(self, message: str) -> None:
        for request_id, listener in list(self.listeners.items()):
            self.engine.abort(request_id)
            self._send(listener, Progress(0, [], True, "error", "", message))
        self.listeners.clear()

    @staticmethod
    def _send(listener, progress: Progress) -> None:
        loop, updates = listener
        try:
            loop.call_soon_threadsafe(updates.put_nowait, progress)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass


def settle(future: asyncio.Future, error: BaseException | None) -> None:
    if not future.done():   # the handler may have gone away meanwhile
        future.set_exception(error) if error is not None else future.set_result(None)


class IncrementalText:
    """Stream text from a growing token list: decode it all, emit the new suffix.

    Held back until they can no longer change: an incomplete UTF-8 character at the end (decoded
    as U+FFFD) and the last len(longest stop string) - 1 characters, which could begin a stop
    string the engine will cut. The finished request's text is the engine's own.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""

    def delta(self, progress: Progress) -> str:
        if progress.finished:
            text = progress.text
        else:
            text = self.tokenizer.decode(progress.token_ids).rstrip("\ufffd")
            text = text[:max(len(text) - self.hold, 0)]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new


class APIError(Exception):
    """An error answered as OpenAI-shaped JSON."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints (top_k is an extension: pass it in extra_body)."""
    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    max_tokens: int = 16


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def turn(self) -> dict:
        """{"role", "content"} with the content as one string."""
        content = self.content if isinstance(self.content, str) else "".join(
            part.text for part in self.content)
        return {"role": self.role, "content": content}


class ChatRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


def chat_prompt(tokenizer, turns: list[dict]) -> list[int]:
    """Token ids of the turns ({"role", "content"}) in the model's chat template, ending where
    the assistant's reply begins. A tokenizer without a template (the tiny model's bytes) gets
    plain `role: content` lines.
    """
    if hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.encode(tokenizer.apply_chat_template(turns))
    return tokenizer.encode("".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant: ")


def build_app(llm, model_name: str) -> FastAPI:
    """The FastAPI app serving `llm` (a reference.engine.LLM) under the name `model_name`."""
    from reference.engine import SamplingParams

    loop = EngineLoop(llm.engine)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title="reference engine", lifespan=lifespan)
    app.state.engine_loop = loop

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, err: RequestValidationError):
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        return await api_error(request, APIError(f"{where}: {first['msg']}", param=where))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        message = (f"no route {request.method} {request.url.path}" if err.status_code == 404
                   else str(err.detail))
        return JSONResponse(APIError(message, err.status_code).body(), status_code=err.status_code)

    def sampling(body: SamplingFields, max_tokens: int):
        if body.model != model_name:
            raise APIError(f"the model {body.model!r} does not exist: this server serves "
                           f"{model_name!r}", param="model", code="model_not_found")
        if body.n != 1:
            raise APIError(f"n={body.n} is not supported: one completion per request (n=1)",
                           param="n")
        if max_tokens < 1:
            raise APIError(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        try:
            return SamplingParams(temperature=body.temperature, top_p=body.top_p,
                                  top_k=body.top_k, max_tokens=max_tokens, seed=body.seed,
                                  stop=body.stop)
        except (ValueError, TypeError) as err:
            raise APIError(str(err)) from None

    async def start(prompt, params, request: Request, prefix: str):
        """Submit and wait for the first progress (so a rejected request still gets a 4xx)."""
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        try:
            updates = await loop.submit(prompt, params, request_id)
        except (ValueError, TypeError) as err:
            raise APIError(str(err)) from None
        try:
            first = await next_progress(updates, request)
        except BaseException:
            loop.abort(request_id)
            raise
        if first.finish_reason == "error":
            raise APIError(first.error or "the request failed")
        return request_id, updates, first

    async def next_progress(updates: asyncio.Queue, request: Request) -> Progress:
        while True:
            try:
                return await asyncio.wait_for(updates.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():   # nobody reads the answer
                    raise APIError("the client disconnected", 499, kind="client_closed")

    async def respond(body, prompt, params, request: Request, chat: bool):
        request_id, updates, progress = await start(prompt, params, request,
                                                    "chatcmpl" if chat else "cmpl")
        shape = ChatShape() if chat else CompletionShape()
        text = IncrementalText(llm.tokenizer, [body.stop] if isinstance(body.stop, str)
                               else body.stop or [])
        head = {"id": request_id, "created": int(time.time()), "model": model_name}
        if not body.stream:
            try:
                while not progress.finished:
                    progress = await next_progress(updates, request)
            finally:
                if not progress.finished:
                    loop.abort(request_id)
            if progress.finish_reason == "error":
                raise APIError(progress.error or "the request failed", 500, kind="server_error")
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
                    yield sse(APIError(progress.error or "the request failed", 500,
                                       kind="server_error").body())
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
                loop.abort(request_id)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": created, "owned_by": "reference"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await respond(body, body.prompt, sampling(body, body.max_tokens), request, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_MAX_TOKENS
        params = sampling(body, max_tokens)
        return await respond(body, chat_prompt(llm.tokenizer, [m.turn() for m in body.messages]), params, request,
                             True)

    return app


class CompletionShape:
    whole, chunk, text_key, first_delta = "text_completion", "text_completion", "text", None

    @staticmethod
    def choice(text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def delta_choice(self, delta: dict, finish_reason: str | None) -> dict:
        return self.choice(delta.get("text", ""), finish_reason)


class ChatShape:
    whole, chunk, text_key = "chat.completion", "chat.completion.chunk", "content"
    first_delta = {"role": "assistant", "content": ""}

    @staticmethod
    def choice(text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish_reason}

    @staticmethod
    def delta_choice(delta: dict, finish_reason: str | None) -> dict:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def usage(progress: Progress) -> dict:
    return {"prompt_tokens": progress.prompt_tokens, "completion_tokens": len(progress.token_ids),
            "total_tokens": progress.prompt_tokens + len(progress.token_ids)}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def serve(args) -> None:
    """Run the server until interrupted (args: the `serve` options of reference/__main__.py)."""
    import uvicorn

    from reference.engine import LLM
    from reference.threads import configure

    configure(args.threads)
    llm = LLM(model=args.model, block_size=args.block_size, num_blocks=args.num_blocks,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=not args.no_prefix_caching, scheduling=args.scheduling,
              attention=args.attention)
    uvicorn.run(build_app(llm, args.model), host=args.host, port=args.port, log_level="info")
