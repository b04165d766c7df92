"""Length-prefixed messages between the grader and the sandbox worker.

A message is an 8-byte big-endian length followed by ``torch.save`` bytes of plain data.
Reading uses ``torch.load(weights_only=True)`` (never pickle) and a size cap, because the worker
side is controlled by learner code.
"""
from __future__ import annotations

import io
import os
import select
import struct
import time
from typing import Any

import torch

HEADER = struct.Struct(">Q")
MAX_MESSAGE = 256 * 2**20


class ProtocolError(Exception):
    """The other side sent something that is not a valid message (or too large)."""


def encode(obj: Any) -> bytes:
    """Header + ``torch.save`` bytes of ``obj`` (plain data only)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    return HEADER.pack(len(data)) + data


def decode(data: bytes) -> Any:
    """Inverse of ``encode`` without the header; raises ``ProtocolError`` on bad data."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        raise ProtocolError(f"unreadable message ({type(exc).__name__}: {exc})") from None


def write_message(fd: int, obj: Any, deadline: float | None = None) -> None:
    """Send ``obj`` on file descriptor ``fd``. With a ``deadline`` (a ``time.monotonic()``
    value; ``fd`` should then be non-blocking) waiting for room in the pipe raises
    ``TimeoutError`` once it has passed, so a reader that stops reading cannot block us."""
    view = memoryview(encode(obj))
    while view:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise TimeoutError
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int, deadline: float | None = None, limit: int = MAX_MESSAGE) -> Any:
    """Next message from ``fd``. ``deadline`` is a ``time.monotonic()`` value (``TimeoutError``
    when passed); EOF raises ``EOFError``; a message over ``limit`` bytes ``ProtocolError``."""
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if size > limit:
        raise ProtocolError(f"message of {size} bytes exceeds the limit of {limit} bytes")
    return decode(_read_exact(fd, size, deadline))
