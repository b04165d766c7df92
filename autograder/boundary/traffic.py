"""The memory traffic of a Triton kernel launch, per tensor argument, seen by the interpreter.

Under ``TRITON_INTERPRET=1`` every load and store of a kernel goes through the interpreter's
builder (``triton.runtime.interpreter.InterpreterBuilder``): ``tl.load``/``tl.store`` as
``create_masked_load``/``create_masked_store`` (``create_load``, ``create_store``, the atomic
loads and stores and the tensor-descriptor loads and stores call those two), the other atomics
as ``create_atomic_rmw``/``create_atomic_cas`` (a read and a write each). ``install()`` wraps
these on the class, once, before any learner cell runs; ``recording(args, kwargs)`` counts, for
one launch, the elements each access touches (masked-off lanes not counted), attributed by
address to the launch's tensor arguments. A program starts at ``set_grid_idx``, also wrapped, so
the counts say how often one program touched one element as well as how often all did.

The result travels as plain data (``Recording.wire()``) and is read grader side as
``LaunchTraffic`` (``LaunchTraffic.from_wire``): per argument, the loads and stores of every
element (int32 tensors shaped as the argument), the most loads and stores of one element by one
program, and the most elements of it one load brought in; plus the accesses that fell outside
every argument.

Out of a cell's reach: the functions used here are bound when this module is imported (before
any learner code), and ``tampered()`` lists what changed since ``install()`` among the
interpreter's functions and classes and this module's own; the worker refuses to launch a kernel
while anything has.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy
import torch

_concatenate, _unique, _searchsorted = numpy.concatenate, numpy.unique, numpy.searchsorted
_broadcast_to, _zeros, _asarray = numpy.broadcast_to, numpy.zeros, numpy.asarray
_cumsum, _bincount, _maximum = numpy.cumsum, numpy.bincount, numpy.maximum
_maximum_at, _add_at = numpy.maximum.at, numpy.add.at
_as_strided = numpy.lib.stride_tricks.as_strided
_uint64, _int64, _int32 = numpy.uint64, numpy.int64, numpy.int32
_from_numpy = torch.from_numpy
_data_ptr, _element_size = torch.Tensor.data_ptr, torch.Tensor.element_size
_size, _stride = torch.Tensor.size, torch.Tensor.stride

_ACTIVE: list["Recording"] = []          # the launch being recorded (at most one)
_SNAPSHOT: dict[str, dict[str, int]] = {}  # what tampered() compares with


class Recording:
    """The accesses of one launch to ``tensors`` (key -> tensor: argument position or keyword)."""

    def __init__(self, tensors: dict[Any, torch.Tensor]):
        self.keys = list(tensors)
        shapes = [(_size(t), _stride(t), _element_size(t), _data_ptr(t)) for t in tensors.values()]
        spans = [1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
                 for size, stride, _, _ in shapes]
        # by start address; of two that start alike the larger last, which an address finds
        order = sorted(range(len(shapes)), key=lambda i: (shapes[i][3], spans[i]))
        self.order = order
        self.starts = _asarray([shapes[i][3] for i in order], dtype=_uint64)
        self.ends = _asarray([shapes[i][3] + spans[i] * shapes[i][2] for i in order],
                             dtype=_uint64)
        self.itemsize = _asarray([shapes[i][2] for i in order], dtype=_uint64)
        self.base = _asarray([0, *_cumsum([spans[i] for i in order])], dtype=_int64)
        self.shapes = shapes
        total = int(self.base[-1])
        self.reads, self.writes = _zeros(total, _int64), _zeros(total, _int64)
        self.most = {"reads": _zeros(len(order), _int64),
                     "writes": _zeros(len(order), _int64)}
        self.widest_read = _zeros(len(order), _int64)
        self.outside = {"reads": 0, "writes": 0}
        self.program: dict[str, list] = {"reads": [], "writes": []}

    def access(self, kind: str, pointers: numpy.ndarray, mask: numpy.ndarray | None) -> None:
        """Count the lanes of one load or store (``kind``: "reads" or "writes") that ``mask``
        keeps, at the addresses ``pointers``."""
        addresses = pointers.reshape(-1) if mask is None else \
            pointers[_broadcast_to(mask, pointers.shape)]
        addresses = addresses.astype(_uint64, copy=False)
        if not addresses.size:
            return
        index = _searchsorted(self.starts, addresses, side="right").astype(_int64) - 1
        inside = index >= 0
        inside[inside] = addresses[inside] < self.ends[index[inside]]
        self.outside[kind] += int(addresses.size - inside.sum())
        index, addresses = index[inside], addresses[inside]
        offsets = ((addresses - self.starts[index]) // self.itemsize[index]).astype(_int64)
        positions = self.base[index] + offsets
        self.program[kind].append(positions)
        if kind == "reads":
            self.widest_read = _maximum(self.widest_read,
                                        _bincount(index, minlength=len(self.order)))

    def end_program(self) -> None:
        """Fold the program that just ran into the totals and the per-program maxima."""
        for kind, parts in self.program.items():
            if not parts:
                continue
            positions, counts = _unique(_concatenate(parts), return_counts=True)
            _add_at(self.reads if kind == "reads" else self.writes, positions, counts)
            arguments = _searchsorted(self.base, positions, side="right") - 1
            _maximum_at(self.most[kind], arguments, counts)
            parts.clear()

    def wire(self) -> dict:
        """Plain data: {"arguments": {key: {"reads", "writes", "most_reads", "most_writes",
        "widest_read"}}, "outside_reads", "outside_writes"}."""
        self.end_program()
        arguments = {}
        for rank, i in enumerate(self.order):
            size, stride, _, _ = self.shapes[i]
            first, last = int(self.base[rank]), int(self.base[rank + 1])

            def shaped(counts: numpy.ndarray) -> torch.Tensor:
                view = _as_strided(counts[first:last], size, [s * 8 for s in stride]) \
                    if last > first else _zeros(size, _int64)
                return _from_numpy(view.astype(_int32))
            arguments[self.keys[i]] = {
                "reads": shaped(self.reads), "writes": shaped(self.writes),
                "most_reads": int(self.most["reads"][rank]),
                "most_writes": int(self.most["writes"][rank]),
                "widest_read": int(self.widest_read[rank])}
        return {"arguments": arguments, "outside_reads": self.outside["reads"],
                "outside_writes": self.outside["writes"]}


# Each hook names only the arguments it counts and passes the rest through untouched, so that a
# triton release that adds or splits the others still runs (3.6 has a cache modifier and an
# eviction policy after a load's mask where 3.9 has one cache policy: a hook spelling out 3.9's
# list failed every load under 3.6).
def _load(original):
    def create_masked_load(self, ptrs, mask, *options):
        if _ACTIVE:
            _ACTIVE[0].access("reads", ptrs.data, mask.data)
        return original(self, ptrs, mask, *options)
    return create_masked_load


def _store(original):
    def create_masked_store(self, ptrs, value, mask, *options):
        if _ACTIVE:
            _ACTIVE[0].access("writes", ptrs.data, mask.data)
        return original(self, ptrs, value, mask, *options)
    return create_masked_store


def _read_modify_write(original):
    def create_atomic_rmw(self, op, ptr, val, mask, *options):
        if _ACTIVE:
            _ACTIVE[0].access("reads", ptr.data, mask.data)
            _ACTIVE[0].access("writes", ptr.data, mask.data)
        return original(self, op, ptr, val, mask, *options)
    return create_atomic_rmw


def _compare_and_swap(original):
    def create_atomic_cas(self, ptr, cmp, val, *options):
        if _ACTIVE:
            _ACTIVE[0].access("reads", ptr.data, None)
            _ACTIVE[0].access("writes", ptr.data, None)
        return original(self, ptr, cmp, val, *options)
    return create_atomic_cas


def _next_program(original):
    def set_grid_idx(self, *index):
        if _ACTIVE:
            _ACTIVE[0].end_program()
        return original(self, *index)
    return set_grid_idx


HOOKS = {"create_masked_load": _load, "create_masked_store": _store,
         "create_atomic_rmw": _read_modify_write, "create_atomic_cas": _compare_and_swap,
         "set_grid_idx": _next_program}


_PLACES: dict[str, Any] = {}   # place -> its live namespace, taken by install()


def _places(callers: dict[str, Any]) -> dict[str, Any]:
    """What the accounting rests on, by place (live namespaces): the interpreter's module,
    builder (class and instance), semantic, executor and native functions, this module and its
    ``Recording``, and the ``callers``' places."""
    from triton._C.libtriton import interpreter as native
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter
    return {"interpreter": vars(interpreter),
            "InterpreterBuilder": vars(interpreter.InterpreterBuilder),
            "interpreter_builder": vars(interpreter.interpreter_builder),
            "interpreter_semantic": vars(interpreter.interpreter_semantic),
            "TritonSemantic": vars(TritonSemantic), "GridExecutor": vars(interpreter.GridExecutor),
            "InterpretedFunction": vars(interpreter.InterpretedFunction), "native": vars(native),
            "traffic": globals(), "Recording": vars(Recording), **callers}


PLAIN = (int, float, str, bytes, bool, tuple, list, dict, set, type(None))


def _identities(places: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
    """id() of every object but plain data (functions, classes, modules, the builder) in the
    watched ``places`` (all of them by default)."""
    return {place: {name: id(value) for name, value in list(_PLACES[place].items())
                    if type(value) not in PLAIN}     # a subclass of list is not plain data
            for place in (_PLACES if places is None else places)}


def install(callers: dict[str, Any] | None = None) -> None:
    """Wrap the interpreter builder's memory accesses (once) and remember what the accounting
    rests on, for ``tampered()``: with ``callers`` (place -> namespace, e.g. the worker's
    globals), what the caller's launch rests on too. The namespaces are kept, not looked up
    again, so a module put in another's place changes nothing."""
    if _SNAPSHOT:   # installed already: only places not watched yet are added
        added = {place: names for place, names in (callers or {}).items() if place not in _PLACES}
        _PLACES.update(added)
        _SNAPSHOT.update(_identities(added))
        return
    from triton.runtime.interpreter import InterpreterBuilder
    for name, hook in HOOKS.items():
        setattr(InterpreterBuilder, name, hook(vars(InterpreterBuilder)[name]))
    _PLACES.update(_places(callers or {}))
    _SNAPSHOT.update(_identities())


def tampered(places: Iterable[str] | None = None) -> list[str]:
    """``place.name`` of every function, class or module the accounting rests on that was
    rebound, removed or added since ``install()`` (in ``places`` only, if given)."""
    places = [p for p in (_SNAPSHOT if places is None else places) if p in _SNAPSHOT]
    now = _identities(places)
    return sorted(f"{place}.{name}" for place in places
                  for name in set(_SNAPSHOT[place]) | set(now[place])
                  if _SNAPSHOT[place].get(name) != now[place].get(name))


@contextlib.contextmanager
def recording(args: tuple, kwargs: dict) -> Iterator[Recording]:
    """Count the accesses of the launch run inside the block to the tensors of ``args`` (keys:
    positions) and ``kwargs`` (keys: names)."""
    tensors = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    tensors |= {k: a for k, a in kwargs.items() if isinstance(a, torch.Tensor)}
    record = Recording(tensors)
    _ACTIVE[:] = [record]
    try:
        yield record
    finally:
        _ACTIVE.clear()


# ------------------------------------------------------------------------- grader side

@dataclass
class ArgumentTraffic:
    """One tensor argument's traffic in one launch: ``reads``/``writes`` (int32, shaped as the
    argument) say how many times each element was loaded/stored (masked-off lanes not counted);
    ``most_reads``/``most_writes``: the most times one program loaded/stored one element;
    ``widest_read``: the most elements of this argument one load brought in."""
    reads: torch.Tensor
    writes: torch.Tensor
    most_reads: int
    most_writes: int
    widest_read: int


@dataclass
class LaunchTraffic:
    """The traffic of one launch: ``arguments`` by position (or keyword), and the loads and
    stores that fell outside every tensor argument."""
    arguments: dict[Any, ArgumentTraffic]
    outside_reads: int
    outside_writes: int

    def __getitem__(self, key: Any) -> ArgumentTraffic:
        return self.arguments[key]

    @classmethod
    def from_wire(cls, value: Any) -> "LaunchTraffic | None":
        """The record a worker sent, or None when it is not one (no accounting, or garbage)."""
        try:
            arguments = {key: ArgumentTraffic(
                torch.as_tensor(a["reads"]), torch.as_tensor(a["writes"]), int(a["most_reads"]),
                int(a["most_writes"]), int(a["widest_read"]))
                for key, a in value["arguments"].items()}
            return cls(arguments, int(value["outside_reads"]), int(value["outside_writes"]))
        except (TypeError, KeyError, AttributeError, ValueError, RuntimeError):
            return None
