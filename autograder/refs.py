"""Markers that tests pass to the learner, and the plain-data form they travel in.

A grader test cannot send a model or a cache to the sandbox; it sends a marker instead:

- ``ModelRef(name="tiny", seed=0)``: the worker builds ``reference.model.build_tiny(seed)``.
- ``CacheRef(model_seed, max_len=None)``: ``build_tiny(model_seed).new_cache(batch=1, max_len=max_len)``.
- ``Handle(id)``: a learner object that lives in the sandbox (returned by ``learner.new`` or by a
  call whose result is not plain data).

Plain data is: None, bool, int, float, str, torch.Tensor, torch.Size, torch.dtype and
lists/tuples/dicts of those. Only plain data crosses the process boundary.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import torch

TAG = "__autograder__"
SCALARS = (type(None), bool, int, float, str, torch.Size, torch.dtype)


@dataclass(frozen=True)
class ModelRef:
    """Stands for ``reference.model.build_tiny(seed)`` (``name`` must be ``"tiny"``)."""
    name: str = "tiny"
    seed: int = 0


@dataclass(frozen=True)
class CacheRef:
    """Stands for a fresh reference ``KVCache`` of ``build_tiny(model_seed)`` (batch 1)."""
    model_seed: int = 0
    max_len: int | None = None


@dataclass(frozen=True)
class Handle:
    """Opaque reference (int ``id``) to a learner object kept by the learner side."""
    id: int


def to_wire(value: Any) -> Any:
    """Replace markers in ``value`` (recursively) by tagged plain dicts; reject other objects."""
    if isinstance(value, ModelRef):
        return {TAG: "model", "name": value.name, "seed": int(value.seed)}
    if isinstance(value, CacheRef):
        return {TAG: "cache", "seed": int(value.model_seed), "max_len": value.max_len}
    if isinstance(value, Handle):
        return {TAG: "handle", "id": int(value.id)}
    if isinstance(value, torch.Tensor):
        return value.detach().as_subclass(torch.Tensor).clone()
    if isinstance(value, SCALARS):
        return value
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_wire(v) for v in value)
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    raise TypeError(f"cannot send a {type(value).__name__} to the learner; use plain data, "
                    "ModelRef, CacheRef or a Handle")


def from_wire(value: Any, resolve: Callable[[dict], Any] | None = None) -> Any:
    """Inverse of ``to_wire``: tagged dicts become ``resolve(tagged)`` or, without ``resolve``,
    ``Handle`` objects (markers other than handles are then an error)."""
    if isinstance(value, dict) and TAG in value:
        if resolve is not None:
            return resolve(value)
        if value[TAG] == "handle" and isinstance(value.get("id"), int):
            return Handle(value["id"])
        raise ValueError(f"unexpected marker {value[TAG]!r} in a learner result")
    if isinstance(value, list):
        return [from_wire(v, resolve) for v in value]
    if isinstance(value, tuple):
        return tuple(from_wire(v, resolve) for v in value)
    if isinstance(value, dict):
        return {k: from_wire(v, resolve) for k, v in value.items()}
    return value


class Resolver:
    """Learner-side store: turns tagged markers into objects and non-plain results into handles.

    ``build_tiny`` is ``reference.model.build_tiny`` (passed in so that this module never imports
    ``reference``). Every model built here records ``(tuple(input_ids.shape), cache_passed)`` in
    ``self.trace`` on each forward call.
    """

    def __init__(self, build_tiny: Callable[[int], torch.nn.Module]):
        self.build_tiny = build_tiny
        self.objects: dict[int, Any] = {}
        self.trace: list[tuple[tuple[int, ...], bool]] = []
        self._ids = itertools.count(1)
        self._models: dict[int, torch.nn.Module] = {}

    def model(self, seed: int) -> torch.nn.Module:
        """The tiny reference model for ``seed`` (built once, traced)."""
        if seed not in self._models:
            model = self.build_tiny(seed)
            model.register_forward_pre_hook(self._record, with_kwargs=True)
            self._models[seed] = model
        return self._models[seed]

    def _record(self, module, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        cache = args[2] if len(args) > 2 else kwargs.get("cache")
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else ()
        self.trace.append((shape, cache is not None))

    def resolve(self, tagged: dict) -> Any:
        """Object for one tagged marker (``to_wire`` form)."""
        kind = tagged[TAG]
        if kind == "model":
            if tagged["name"] != "tiny":
                raise ValueError(f"unknown model {tagged['name']!r} (only 'tiny')")
            return self.model(tagged["seed"])
        if kind == "cache":
            return self.model(tagged["seed"]).new_cache(batch=1, max_len=tagged["max_len"])
        if kind == "handle":
            if tagged["id"] not in self.objects:
                raise LookupError("this handle is unknown here (the worker was restarted "
                                  "after a crash or time-out, so earlier objects are gone)")
            return self.objects[tagged["id"]]
        raise ValueError(f"unknown marker {kind!r}")

    def args(self, wire_value: Any) -> Any:
        """Arguments in wire form -> objects the learner code receives."""
        return from_wire(wire_value, self.resolve)

    def result(self, value: Any) -> Any:
        """A learner result -> wire form; objects that are not plain data become handles."""
        if isinstance(value, torch.Tensor):
            return value.detach().as_subclass(torch.Tensor).clone()
        if isinstance(value, SCALARS):
            return value
        if type(value) is list:
            return [self.result(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.result(v) for v in value)
        if type(value) is dict and all(isinstance(k, (str, int)) for k in value):
            return {k: self.result(v) for k, v in value.items()}
        handle = next(self._ids)
        self.objects[handle] = value
        return {TAG: "handle", "id": handle}
