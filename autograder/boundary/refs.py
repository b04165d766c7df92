"""Markers that grader tests pass to the learner, and the plain-data form they travel in.

A grader test never sends a model or a cache to the learner's process; it sends a marker:

- ``ModelRef(name="tiny", seed=0, role="")``: ``reference.model.build_tiny(seed)``; markers
  with the same seed and role stand for one object, another role for a separate object with
  the same weights (a draft equal to the target whose forwards must still be told apart).
- ``CacheRef(model_seed, max_len=None)``: a fresh ``build_tiny(model_seed).new_cache(batch=1,
  max_len=max_len)``.
- ``Handle(id)``: a learner object that lives on the learner side (returned by ``learner.new``
  or by a call whose result is not plain data).

The grader keeps the model or cache itself (``autograder.boundary.store.ReferenceStore``) and sends a
``Remote(kind, id)``; on the learner side it becomes a proxy whose every use is a request back to
the grader (``autograder.boundary.proxies``). No reference object ever exists in the learner's process.

Plain data is: None, bool, int, float, str, torch.Tensor, torch.Size, torch.dtype and
lists/tuples/dicts of those. Only plain data crosses the process boundary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

TAG = "__autograder__"
SCALARS = (type(None), bool, int, float, str, torch.Size, torch.dtype)


@dataclass(frozen=True)
class ModelRef:
    """Stands for ``reference.model.build_tiny(seed)`` (``name`` must be ``"tiny"``); ``role``
    names a separate object with the same weights."""
    name: str = "tiny"
    seed: int = 0
    role: str = ""


@dataclass(frozen=True)
class CacheRef:
    """Stands for a fresh reference ``KVCache`` of ``build_tiny(model_seed)`` (batch 1)."""
    model_seed: int = 0
    max_len: int | None = None


@dataclass(frozen=True)
class Handle:
    """Opaque reference (int ``id``) to a learner object kept by the learner side."""
    id: int


@dataclass(frozen=True)
class Remote:
    """A grader-side object (``kind`` "model" or "cache", int ``id``) seen from the learner."""
    kind: str
    id: int


def _each_item(container: list | tuple | dict, convert: Callable[[Any], Any]) -> list | tuple | dict:
    """A new list, tuple or dict (as ``container`` is) of ``convert`` applied to each item."""
    if isinstance(container, list):
        return [convert(v) for v in container]
    if isinstance(container, tuple):
        return tuple(convert(v) for v in container)
    return {k: convert(v) for k, v in container.items()}


def to_wire(value: Any, register: Callable[[Any], Remote] | None = None) -> Any:
    """``value`` with markers replaced (recursively) by tagged plain dicts; other objects are
    refused. ``register`` turns a ``ModelRef``/``CacheRef`` into the ``Remote`` it stands for."""
    if isinstance(value, (ModelRef, CacheRef)):
        if register is None:
            raise TypeError("a ModelRef/CacheRef needs the grader's store to travel")
        value = register(value)
    if isinstance(value, Remote):
        return {TAG: "remote", "kind": str(value.kind), "id": int(value.id)}
    if isinstance(value, Handle):
        return {TAG: "handle", "id": int(value.id)}
    if isinstance(value, torch.Tensor):
        return value.detach().as_subclass(torch.Tensor).clone()
    if isinstance(value, SCALARS):
        return value
    if isinstance(value, (list, tuple, dict)):
        return _each_item(value, lambda v: to_wire(v, register))
    raise TypeError(f"cannot send a {type(value).__name__} to the learner; use plain data, "
                    "ModelRef, CacheRef or a Handle")


def from_wire(value: Any, resolve: Callable[[dict], Any] | None = None) -> Any:
    """Inverse of ``to_wire``: tagged dicts become ``resolve(tagged)`` or, without ``resolve``,
    ``Handle``/``Remote`` objects (anything else tagged is an error)."""
    if isinstance(value, dict) and TAG in value:
        if resolve is not None:
            return resolve(value)
        if value[TAG] == "handle" and isinstance(value.get("id"), int):
            return Handle(value["id"])
        if value[TAG] == "remote" and isinstance(value.get("id"), int) \
                and isinstance(value.get("kind"), str):
            return Remote(value["kind"], value["id"])
        raise ValueError(f"unexpected marker {value[TAG]!r} in a learner result")
    if isinstance(value, (list, tuple, dict)):
        return _each_item(value, lambda v: from_wire(v, resolve))
    return value
