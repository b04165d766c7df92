"""Grader side of the proxies: the reference models and caches that learner code uses.

Learner code gets ``autograder.boundary.proxies.ModelProxy``/``CacheProxy`` objects; each use is a
request ``{"op": "remote", "id", "method", "args", "kwargs"}`` answered here, in the grader's
process, by the reference objects. Every forward is recorded in ``trace`` here, where learner
code cannot reach it, so what a grader test checks about *how* the learner computed rests on
grader-side state only.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import torch

from autograder.boundary.refs import CacheRef, ModelRef, Remote, from_wire, to_wire

MODEL_METHODS = {"forward", "new_cache", "config"}
MAX_OBJECTS = 256  # models and caches per submission: learner requests must not exhaust us
MAX_BATCH = 8
CACHE_METHODS = {"append", "read", "truncate", "length", "max_len", "nbytes"}


@dataclass(frozen=True)
class Forward:
    """One model call seen by the grader: input shape, which cache (``None``: no cache), the
    cache's length before the call (where the call gave ``positions``: what it kept, the model
    cutting a longer cache back to ``positions[0]``, a rollback written by position), which model ran it (its id in the store; every cache, the
    grader's or one the learner made with ``new_cache``, is recorded alike), and the token ids
    it was fed (the first sequence of the batch)."""
    shape: tuple[int, ...]
    cache: int | None
    cache_length: int
    model: int = 0
    tokens: tuple[int, ...] = ()


class ReferenceStore:
    """Reference models (``build_tiny(seed)``, built once per seed) and caches, by id."""

    def __init__(self):
        self.objects: dict[int, Any] = {}
        self.kinds: dict[int, str] = {}
        self.trace: list[Forward] = []
        self._models: dict[tuple[int, str], int] = {}
        self._ids = itertools.count(1)

    def _add(self, kind: str, obj: Any) -> Remote:
        if len(self.objects) >= MAX_OBJECTS:
            raise ValueError(f"more than {MAX_OBJECTS} models and caches were requested")
        key = next(self._ids)
        self.objects[key], self.kinds[key] = obj, kind
        return Remote(kind, key)

    def model(self, seed: int, role: str = "") -> Remote:
        """The tiny reference model of ``seed`` (built once per seed and ``role``)."""
        if (seed, role) not in self._models:
            from reference.model import build_tiny
            self._models[seed, role] = self._add("model", build_tiny(seed)).id
        return Remote("model", self._models[seed, role])

    def model_id(self, marker: ModelRef) -> int:
        """The store id of the model ``marker`` stands for (to pick its forwards in ``trace``)."""
        return self.model(int(marker.seed), str(marker.role)).id

    def register(self, marker: ModelRef | CacheRef) -> Remote:
        """The grader-side object a marker stands for (a new cache for every ``CacheRef``)."""
        if isinstance(marker, ModelRef):
            if marker.name != "tiny":
                raise ValueError(f"unknown model {marker.name!r} (only 'tiny')")
            return self.model(int(marker.seed), str(marker.role))
        model = self.objects[self.model(int(marker.model_seed)).id]
        return self._add("cache", model.new_cache(batch=1, max_len=marker.max_len))

    def get(self, remote: Remote) -> Any:
        """The grader-side object behind ``remote`` (e.g. to inspect a cache after a call)."""
        return self.objects[remote.id]

    def caches(self) -> list[Any]:
        """Every cache created so far, oldest first."""
        return [self.objects[k] for k, kind in self.kinds.items() if kind == "cache"]

    # -- requests from the learner side -------------------------------------------------------
    def handle(self, request: dict) -> dict:
        """Answer one remote request; errors become ``{"ok": False, "error": message}``."""
        try:
            return {"ok": True, "value": to_wire(self._run(request))}
        except Exception as exc:  # noqa: BLE001 - learner input must never crash the grader
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000]}

    def _run(self, request: dict) -> Any:
        key, method = request.get("id"), request.get("method")
        kind = self.kinds.get(key) if isinstance(key, int) else None
        if kind is None or method not in (MODEL_METHODS if kind == "model" else CACHE_METHODS):
            raise ValueError(f"{kind or 'object'} has no method {method!r} here")
        args = from_wire(request.get("args", ()), self._resolve)
        kwargs = from_wire(request.get("kwargs", {}), self._resolve)
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            raise TypeError("malformed request")
        return getattr(self, f"_{kind}_{method}")(self.objects[key], *args, **kwargs)

    def _resolve(self, tagged: dict) -> Any:
        if tagged.get("kind") == "cache" and self.kinds.get(tagged.get("id")) == "cache":
            return self.objects[tagged["id"]]
        raise TypeError("only the cache the grader gave you can be passed to the model")

    # -- cache methods (same signatures as reference.kv_cache.KVCache) ---------------------------
    def _cache_length(self, cache) -> int:
        return int(cache.length)

    def _cache_max_len(self, cache) -> int:
        return int(cache.max_len)

    def _cache_nbytes(self, cache) -> int:
        return int(cache.nbytes())

    def _cache_truncate(self, cache, n) -> None:
        cache.truncate(_int(n, "n"))

    def _cache_read(self, cache, layer) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.clone() for t in cache.read(_layer(cache, layer)))

    def _cache_append(self, cache, layer, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
            raise TypeError("append(layer, k, v) takes two tensors")
        return tuple(t.clone() for t in cache.append(_layer(cache, layer), k, v))

    # -- model methods --------------------------------------------------------------------------
    def _model_config(self, model) -> dict:
        return asdict(model.config)

    def _model_new_cache(self, model, batch: int = 1, max_len: int | None = None) -> Remote:
        batch = _int(batch, "batch")
        max_len = None if max_len is None else _int(max_len, "max_len")
        if not 1 <= batch <= MAX_BATCH or not 1 <= (max_len or model.config.max_seq_len) <= \
                model.config.max_seq_len:
            raise ValueError(f"new_cache(batch={batch}, max_len={max_len}) is out of range")
        return self._add("cache", model.new_cache(batch=batch, max_len=max_len))

    def _model_forward(self, model, input_ids=None, positions=None, cache=None) -> torch.Tensor:
        cfg = model.config
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
                or input_ids.dtype.is_floating_point or input_ids.shape[1] == 0:
            raise ValueError("input_ids must be an integer tensor of shape [batch, T], T >= 1")
        if input_ids.shape[0] > MAX_BATCH or input_ids.shape[1] > cfg.max_seq_len:
            raise ValueError(f"input_ids of shape {list(input_ids.shape)}: at most {MAX_BATCH} "
                             f"sequences of {cfg.max_seq_len} tokens")
        if input_ids.numel() and not (0 <= int(input_ids.min()) and
                                      int(input_ids.max()) < cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size})")
        if positions is not None and (not isinstance(positions, torch.Tensor)
                                      or positions.shape != (input_ids.shape[1],)):
            raise ValueError("positions must be a tensor of shape [T]")
        length = int(cache.length) if cache is not None else 0
        if cache is not None and positions is not None:   # written by position: the model cuts
            length = min(length, int(positions[0]))        # a longer cache back to positions[0]
        key = next((k for k, o in self.objects.items() if o is cache), None)
        model_key = next(k for k, o in self.objects.items() if o is model)
        self.trace.append(Forward(tuple(input_ids.shape), key, length, model_key,
                                  tuple(int(t) for t in input_ids[0].tolist())))
        return model(input_ids.long(), positions, cache)


def _layer(cache, layer) -> int:
    layer = _int(layer, "layer")
    if not 0 <= layer < cache.k.shape[0]:
        raise IndexError(f"layer {layer} out of range (the cache has {cache.k.shape[0]} layers)")
    return layer


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


class GraderSideTrace:
    """What grader tests read about *how* the learner computed: the forwards of the last call,
    recorded by ``self.store`` in the grader's process (mixed into both learner classes)."""
    store: ReferenceStore

    @property
    def last_trace(self) -> list[tuple[tuple[int, ...], bool]]:
        """(input shape, cache passed) of every forward of the last call."""
        return [(f.shape, f.cache is not None) for f in self.store.trace]

    @property
    def trace(self) -> list[Forward]:
        """``Forward`` records (shape, cache id, cache length, model id) of the last call."""
        return list(self.store.trace)
