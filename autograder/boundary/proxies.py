"""Learner side of the grader's objects, and the guard against forbidden functions.

``ModelProxy`` and ``CacheProxy`` stand for a model or cache that lives in the grader's process
(``autograder.boundary.store``): calling one sends a request through ``channel`` and returns the grader's
answer. They hold nothing but an id, so no reference code or weights exist on this side.
``LearnerSide`` keeps the learner's objects (``Handle`` ids) and converts arguments and results.
This module must never import ``reference``.
"""
from __future__ import annotations

import itertools
import types
from typing import Any, Callable

import torch

from autograder.boundary.guard import limits_paused
from autograder.boundary.refs import SCALARS, TAG, Handle, Remote, from_wire

Channel = Callable[[dict], dict]


class _Proxy:
    """Common part: the grader-side ``_id`` and the ``_channel`` requests go through."""

    def __init__(self, remote_id: int, channel: Channel):
        self._id, self._channel = remote_id, channel

    def _remote(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with limits_paused():   # copying the arguments is our work, not the learner's
            reply = self._channel({"op": "remote", "id": self._id, "method": method,
                                   "args": _plain(args), "kwargs": _plain(kwargs)})
        if not reply.get("ok"):
            raise ValueError(f"the grader's {type(self).__name__[:-5].lower()} refused: "
                             f"{reply.get('error')}")
        return from_wire(reply.get("value"), self._wrap)

    def _wrap(self, tagged: dict) -> Any:
        return proxy(tagged, self._channel)


class ModelProxy(_Proxy):
    """The grader's model: ``model(input_ids [B, T], positions=None, cache=None)`` -> logits
    [B, T, vocab]; ``forward`` is the same call; ``new_cache(batch, max_len)``; ``config``."""

    def __call__(self, input_ids, positions=None, cache=None):
        return self._remote("forward", input_ids, positions, cache)

    def forward(self, input_ids, positions=None, cache=None):
        return self._remote("forward", input_ids, positions, cache)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> "CacheProxy":
        return self._remote("new_cache", batch, max_len)

    @property
    def config(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(**self._remote("config"))

    def eval(self):
        return self

    def __repr__(self) -> str:
        return f"<model {self._id}, run by the grader>"


class CacheProxy(_Proxy):
    """The grader's KV cache: ``append(layer, k, v)``, ``read(layer)``, ``truncate(n)``,
    ``length``, ``max_len``, ``nbytes()`` (tensors come back as copies)."""

    @property
    def length(self) -> int:
        return self._remote("length")

    @property
    def max_len(self) -> int:
        return self._remote("max_len")

    def append(self, layer, k, v):
        return self._remote("append", layer, k, v)

    def read(self, layer):
        return self._remote("read", layer)

    def truncate(self, n) -> None:
        self._remote("truncate", n)

    def nbytes(self) -> int:
        return self._remote("nbytes")

    def __repr__(self) -> str:
        return f"<KV cache {self._id}, kept by the grader>"


def proxy(tagged: dict, channel: Channel) -> _Proxy:
    """The proxy for a tagged ``Remote`` marker."""
    if tagged.get(TAG) != "remote" or tagged.get("kind") not in ("model", "cache"):
        raise ValueError(f"unexpected marker {tagged.get(TAG)!r}")
    return (ModelProxy if tagged["kind"] == "model" else CacheProxy)(int(tagged["id"]), channel)


PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """A copy of a tensor learner code hands over, as a plain ``torch.Tensor``. A subclass is
    refused before any of its methods runs: its ``__torch_function__`` or ``__torch_dispatch__``
    would run learner code here, after the call, where nothing is recorded."""
    if type(value) not in PLAIN_TENSORS:
        raise TypeError(f"your code handed over a {type(value).__name__}, a subclass of "
                        "torch.Tensor: the grader takes plain tensors only (their operations "
                        "are the ones it records)")
    return value.detach().as_subclass(torch.Tensor).clone()


def _one_of(kind: type, types: tuple) -> bool:
    """``kind`` is one of ``types``, by identity (``in`` would compare with ``==``, which a
    learner's metaclass may define)."""
    return any(kind is t for t in types)


def _scalar(value: Any, kind: type) -> Any:
    """A subclass of float, int or str (numpy's float64 is one) as the plain value, read through
    the base class's own conversion (never a method of the subclass); ``None`` otherwise."""
    for base, convert in ((float, float.__float__), (int, int.__int__), (str, str.__str__)):
        if issubclass(kind, base):
            return convert(value)
    return None


def _items(value: Any) -> Any:
    """The items of a list or tuple (a subclass's too) through the base class's own iterator,
    never the object's ``__iter__``."""
    return tuple.__iter__(value) if issubclass(type(value), tuple) else list.__iter__(value)


def _plain(value: Any) -> Any:
    """Arguments of a proxy call as plain data (proxies become ``Remote`` markers). Decided on
    ``type(value)`` alone: ``isinstance`` would ask the object for its ``__class__``, running
    learner code (a property) here, inside ``limits_paused``, where nothing is recorded."""
    kind = type(value)
    if issubclass(kind, _Proxy):
        return {TAG: "remote", "kind": "model" if issubclass(kind, ModelProxy) else "cache",
                "id": int(value._id)}
    if issubclass(kind, torch.Tensor):
        return plain_tensor(value)
    if _one_of(kind, SCALARS):
        return value
    if (plain := _scalar(value, kind)) is not None:
        return plain
    if issubclass(kind, (list, tuple)):
        return kind(_plain(v) for v in value) if _one_of(kind, (list, tuple)) \
            else [_plain(v) for v in _items(value)]
    if kind is dict and all(_one_of(type(k), (str, int)) for k in value):   # str(k): no
        return {str(k): _plain(v) for k, v in value.items()}             # learner __str__
    raise TypeError(f"the model runs in the grader and cannot receive a {type(value).__name__}; "
                    "pass tensors, numbers and the cache you were given")


class LearnerSide:
    """The learner's objects by handle id, and argument/result conversion on this side."""

    def __init__(self, channel: Channel):
        self.channel = channel
        self.objects: dict[int, Any] = {}
        self._ids = itertools.count(1)

    def resolve(self, tagged: dict) -> Any:
        if tagged[TAG] == "remote":
            return proxy(tagged, self.channel)
        if tagged[TAG] == "handle":
            if tagged["id"] not in self.objects:
                raise LookupError("this handle is unknown here (the worker was restarted "
                                  "after a crash or time-out, so earlier objects are gone)")
            return self.objects[tagged["id"]]
        raise ValueError(f"unknown marker {tagged[TAG]!r}")

    def args(self, wire_value: Any) -> Any:
        """Arguments in wire form -> objects the learner code receives."""
        return from_wire(wire_value, self.resolve)

    def result(self, value: Any) -> Any:
        """A learner result -> wire form; objects that are not plain data become handles."""
        kind = type(value)   # never isinstance: it would run a `__class__` property of the
        if issubclass(kind, _Proxy):   # learner's here, after the recorded call
            return _plain(value)
        if issubclass(kind, torch.Tensor):
            return plain_tensor(value)
        if _one_of(kind, SCALARS):
            return value
        if (plain := _scalar(value, kind)) is not None:
            return plain
        if kind is list:
            return [self.result(v) for v in value]
        if issubclass(kind, tuple):   # a named tuple too; its items, not its own __iter__
            return tuple(self.result(v) for v in tuple.__iter__(value))
        if kind is dict and all(_one_of(type(k), (str, int)) for k in value):
            return {k: self.result(v) for k, v in value.items()}
        handle = next(self._ids)
        self.objects[handle] = value
        return {TAG: "handle", "id": handle}


__all__ = ["CacheProxy", "Handle", "LearnerSide", "ModelProxy", "Remote"]
