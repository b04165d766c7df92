"""The engine's own thread, and the bridge between it and the server's asyncio handlers.

The engine is not thread-safe, so one thread owns it: it applies the adds and aborts that
handlers put on a thread-safe queue, then calls `engine.step()` while any request is unfinished,
and hands each request's progress to that request's asyncio.Queue with
`loop.call_soon_threadsafe`. A request added while others decode joins the batch at the next step.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("reference.engine.server")


@dataclass(frozen=True)
class Progress:
    """A copy of one RequestOutput, made on the engine thread (token_ids are cumulative)."""
    prompt_tokens: int
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    text: str           # decoded token_ids; once finished, cut at a stop string
    error: str | None
    server_fault: bool = False   # the engine failed (not the request): an HTTP 500


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
            self._send(listener, Progress(0, [], True, "error", "", message, server_fault=True))
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
