"""Learner side of forbidden functions: ``Guard`` replaces each function an exercise forbids
(under every name it has in ``torch``, ``torch.nn.functional`` and ``torch._C._nn``; a method
such as ``torch.Tensor.softmax`` on its class) by a wrapper that raises
``ForbiddenFunctionError`` while an exercise that forbids it is being graded. In the sandbox the
guard is installed before any learner cell runs, so aliases taken by a cell are guarded too.
The static look at a cell's source is grader side: ``autograder.rules.forbid``.

Below the names, ``operation_limit`` checks every aten operation learner code runs (a dispatch
mode) against the exercise's allowed set (``autograder.rules.operations``), and records what the
call cost: the largest tensor it allocated and its work (``CallWork``: matmul FLOPs, the FLOPs of
every elementwise product of two tensors however its factors were made, elements exponentiated),
from which a grader tells one pass from two with the same numbers.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

SEARCHED = ("torch", "torch.nn.functional", "torch._C._nn", "torch.functional", "torch.special")


class ForbiddenFunctionError(RuntimeError):
    """Learner code called a function its exercise forbids."""


def _owner(dotted: str) -> tuple[Any, str]:
    """(object holding the function, its attribute name): a module, or a class such as
    ``torch.Tensor`` for a method (``"torch.Tensor.softmax"``)."""
    parent, _, attr = dotted.rpartition(".")
    module, _, cls = parent.rpartition(".")
    if cls[:1].isupper():
        return getattr(importlib.import_module(module), cls), attr
    return importlib.import_module(parent), attr


def _resolve(dotted: str) -> Any:
    owner, attr = _owner(dotted)
    return getattr(owner, attr)


class Guard:
    """Wraps each function of ``names`` (dotted paths); ``active`` is the set that raises now."""

    def __init__(self, names: Iterable[str]):
        self.names = sorted(set(names))
        self.active: frozenset[str] = frozenset()
        self._patches: list[tuple[Any, str, Any]] = []

    def install(self) -> "Guard":
        for name in self.names:
            original = _resolve(name)
            wrapper = self._wrapper(name, original)
            owner, attr = _owner(name)
            if isinstance(owner, type):  # a method: patched on its class (x.softmax(-1))
                setattr(owner, attr, wrapper)
                self._patches.append((owner, attr, original))
                continue
            if getattr(owner, attr) is original and owner.__name__ not in SEARCHED:
                setattr(owner, attr, wrapper)   # where it lives (torch.nn.attention.flex_attention)
                self._patches.append((owner, attr, original))
            for module_name in SEARCHED:
                module = importlib.import_module(module_name)
                for attr, value in list(vars(module).items()):
                    if value is original:
                        setattr(module, attr, wrapper)
                        self._patches.append((module, attr, original))
        return self

    def uninstall(self) -> None:
        for module, attr, original in reversed(self._patches):
            setattr(module, attr, original)
        self._patches.clear()

    def _wrapper(self, name: str, original: Any):
        @functools.wraps(original)
        def guarded(*args, **kwargs):
            if name in self.active:
                raise ForbiddenFunctionError(
                    f"`{name}` is forbidden in this exercise: the grader forbids it so that you "
                    "write the computation yourself")
            return original(*args, **kwargs)
        return guarded

    @contextlib.contextmanager
    def forbidding(self, names: Iterable[str]) -> Iterator[None]:
        """Make ``names`` raise inside the block."""
        before, self.active = self.active, frozenset(names) & frozenset(self.names)
        try:
            yield
        finally:
            self.active = before


# The refusal kept when an operation reaches a tensor subclass with its own ``__torch_dispatch__``
# (``as_subclass``, a wrapper subclass, a nested jagged tensor): torch calls that handler with this
# thread's dispatch modes set aside, so whatever it runs would be neither counted nor refused.
SUBCLASS = "tensor subclass"


class ForbiddenOperationError(RuntimeError):
    """Learner code ran a torch operation outside its exercise's allowed set; ``names`` are the
    operations refused during the call."""

    def __init__(self, names: list[str]):
        super().__init__(f"the operation{'s' if len(names) > 1 else ''} {', '.join(names)} "
                         f"{'are' if len(names) > 1 else 'is'} not allowed in this exercise")
        self.names = list(names)


_PAUSED = [0]   # > 0 while the worker's own code runs inside a learner call (proxies' requests)


@contextlib.contextmanager
def limits_paused() -> Iterator[None]:
    """Operations run inside the block are the worker's own (a proxy serialising a request, the
    copy of a call's result), not the learner's: no limit applies to them. Nor does any
    ``__torch_function__`` (a torch function mode learner code entered, a subclass's): torch's
    overrides are off in the block, so no learner code runs in it unrecorded."""
    _PAUSED[0] += 1
    try:
        with torch._C.DisableTorchFunction():
            yield
    finally:
        _PAUSED[0] -= 1


def operation_name(func: Any) -> str:
    """``aten.name`` of an operation as the dispatcher sees it (overloads folded)."""
    packet = getattr(func, "overloadpacket", func)
    return str(packet)


@dataclass
class CallWork:
    """The work of one learner call, counted at the dispatcher whatever Python name reached
    each operation and however its operands were made.

    ``matmul_flops``: 2 * M * N * K for each product of an [M, K] and a [K, N] matrix (mm, bmm,
    addmm, baddbmm, addbmm, mv, dot: what ``@``, matmul and einsum become), and 2 per element of
    a broadcast product larger than its factors (an outer product, the first half of a matmul
    written as ``(a[:, None] * b[None]).sum(-1)``).

    ``elementwise_flops``: 2 per element of every other elementwise product or quotient of two
    tensors (``ELEMENTWISE_PRODUCTS``: mul, div, addcmul, addcdiv, lerp with a tensor weight,
    floor_divide, remainder and fmod by a tensor, a power of a tensor (x ** 2 is x * x), prod,
    scatter with ``reduce="multiply"``), whatever its factors' sizes: factors copied to the
    product's size (repeat, repeat_interleave, tile, expand(...).contiguous(), index_select with
    repeated indices, cat of copies) and then multiplied and summed are a matrix product's 2 FLOPs
    a term, like a matmul. A product by a Python number (``s * scale``) is not counted.

    ``exp_elements``: elements exponentiated (exp, exp2, expm1, a power with a tensor exponent,
    sigmoid, and the softmax-like operations, one per element of their input).

    ``scalar_reads``: values read out of tensors one at a time as Python numbers (``float(t)``,
    ``.item()``, ``int(t)``, ``bool(t)``: ``aten._local_scalar_dense``), whose arithmetic in
    Python the counts above do not see.

    ``allocated_bytes``: the bytes of every tensor the call's operations made (an output that is
    no view of an input: torch's schema says which; a tensor made from Python values too), in
    total: a property such as "an append writes only its new tokens" is judged on this sum, which
    a copy cut into small pieces cannot hide under the largest allocation."""
    matmul_flops: int = 0
    exp_elements: int = 0
    elementwise_flops: int = 0
    scalar_reads: int = 0
    allocated_bytes: int = 0

    @property
    def product_flops(self) -> int:
        """All the products: matrix products and elementwise ones."""
        return self.matmul_flops + self.elementwise_flops

    def to_wire(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in WORK_FIELDS}

    @classmethod
    def from_wire(cls, value: Any) -> "CallWork":
        """The work a worker's reply carries (zero where it carries none)."""
        value = value if isinstance(value, dict) else {}
        return cls(**{key: count if isinstance(count := value.get(key), int) else 0
                      for key in WORK_FIELDS})


WORK_FIELDS = ("matmul_flops", "exp_elements", "elementwise_flops", "scalar_reads", "allocated_bytes")


def _distinct(t: torch.Tensor) -> int:
    """Elements of ``t`` stored apart: a broadcast (stride-0) dimension counts once."""
    if t.is_contiguous() or t.layout != torch.strided:
        return t.numel()
    return math.prod(size for size, stride in zip(t.shape, t.stride()) if stride)


def _products(factors: list, out: Any) -> tuple[int, int]:
    """(matmul FLOPs, elementwise FLOPs) of an elementwise product of ``factors`` giving ``out``:
    2 per element of ``out`` where at least two factors are tensors (a Python number is a
    scale, not a product), counted as a matrix product's where ``out`` is larger than every
    tensor factor (a broadcast, outer product), else as elementwise products."""
    tensors = [f for f in factors if isinstance(f, torch.Tensor)]
    if len(tensors) < 2 or not isinstance(out, torch.Tensor):
        return 0, 0
    size = out.numel()
    if any(t.numel() == size and t.is_contiguous() for t in tensors):
        return 0, 2 * size  # the usual case, decided without strides: a factor as large as out
    return (2 * size, 0) if size > max(_distinct(t) for t in tensors) else (0, 2 * size)


def _power(args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """A power of a tensor by a number above 1 in size (x ** 2 is x * x, a product of two
    tensors: (a + b)² - (a - b)² = 4ab); a tensor exponent is counted as an exponential."""
    base, exponent = args[0], args[1]
    if isinstance(base, torch.Tensor) and isinstance(exponent, (int, float)) and abs(exponent) > 1:
        return 0, 2 * out.numel()
    return 0, 0


def _reduced_product(args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """prod: one product per element reduced away (``stack([a, b]).prod(0)`` is ``a * b``)."""
    return 0, 2 * max(args[0].numel() - out.numel(), 0)


def _scatter(args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """scatter(self, dim, index, src, reduce="multiply"): one product per element of src scattered."""
    reduce = kwargs.get("reduce", args[4] if len(args) > 4 else None)
    if reduce == "multiply" and len(args) > 3 and isinstance(args[3], torch.Tensor):
        return 0, 2 * args[2].numel()
    return 0, 0


def _matrix(count):
    return lambda args, kwargs, out: (count(args, out), 0)


def _product(factor: int):
    """FLOPs of a (batched) matrix product whose first factor is ``args[factor]``."""
    return _matrix(lambda args, out: 2 * out.numel() * args[factor].shape[-1])


def _exponent_is_tensor(args: tuple, out: Any) -> int:
    return out.numel() if isinstance(args[1], torch.Tensor) else 0


# operation -> count(args, kwargs, out): its (matmul FLOPs, elementwise FLOPs)
_PRODUCT_FLOPS = {
    "aten.mm": _product(0), "aten.bmm": _product(0), "aten.addmm": _product(1),
    "aten.baddbmm": _product(1),
    "aten.addbmm": _matrix(lambda args, out: 2 * out.numel() * args[1].shape[0] * args[1].shape[-1]),
    "aten.mv": _matrix(lambda args, out: 2 * args[0].numel()),
    "aten.dot": _matrix(lambda args, out: 2 * args[0].numel()),
    "aten.vdot": _matrix(lambda args, out: 2 * args[0].numel()),
    **{f"aten.{name}": lambda args, kwargs, out: _products(list(args[:2]), out)
       for name in """mul mul_ div div_ floor_divide floor_divide_ remainder remainder_ fmod
           fmod_""".split()},
    **{f"aten.{name}": lambda args, kwargs, out: _products(list(args[1:3]), out)
       for name in "addcmul addcmul_ addcdiv addcdiv_".split()},
    **{f"aten.{name}": lambda args, kwargs, out: _products(list(args[:3]), out)
       if isinstance(args[2], torch.Tensor) else (0, 0)    # weight * (end - start)
       for name in "lerp lerp_".split()},
    "aten.pow": _power, "aten.pow_": _power,
    "aten.prod": _reduced_product,
    "aten.scatter": _scatter, "aten.scatter_": _scatter,
}
# the operations ``elementwise_flops`` counts (besides the broadcast products of ``matmul_flops``)
ELEMENTWISE_PRODUCTS = frozenset(name for name in _PRODUCT_FLOPS
                                 if name not in {"aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm",
                                                 "aten.addbmm", "aten.mv", "aten.dot", "aten.vdot"})
_EXP_ELEMENTS = {
    **{f"aten.{name}": lambda args, out: out.numel() for name in """exp exp_ exp2 exp2_ expm1
        expm1_ sigmoid sigmoid_ _softmax softmax _log_softmax logcumsumexp _logcumsumexp""".split()},
    "aten.logsumexp": lambda args, out: args[0].numel(),
    "aten.pow": _exponent_is_tensor, "aten.pow_": _exponent_is_tensor,
}


# operations that turn a tensor made outside the dispatcher (torch.tensor of a Python list, of
# float(x) values) into one it sees: their output shares its input's storage, yet is new memory
LIFTS = frozenset({"aten.lift_fresh", "aten.lift_fresh_copy"})
_ACTIVE: list = []   # the operation limits entered and not yet left, innermost last


def active_limit():
    """The innermost operation limit in force (``None`` outside every limit)."""
    return _ACTIVE[-1] if _ACTIVE else None


@functools.lru_cache(maxsize=1)
def _limit_mode():
    """The dispatch mode class, built on first use (the import reaches torch internals)."""
    from torch._C._dynamo import eval_frame
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperationLimit(TorchDispatchMode):
        """While active, every aten operation the learner's code runs is checked against
        ``allowed`` (names such as ``aten.exp``) at the dispatcher, below every Python name a
        cell could use. The first one outside raises ``ForbiddenOperationError`` and is kept in
        ``refused``, so that catching the error does not hide it; so is an operation on a
        tensor subclass with a ``__torch_dispatch__`` of its own (``SUBCLASS``: torch would run
        that handler with this mode set aside, unrecorded). ``largest`` is the size in
        bytes of the largest tensor any allowed operation allocated (views of an input do not
        count; a tensor made from Python values, ``torch.tensor(list)``, does): a grader checks
        "bounded memory" with it on every test size. ``work`` adds up the call's matmul FLOPs,
        elementwise products and elements exponentiated (``CallWork``): a grader checks "one
        pass" with it. The run-time walls at a tensor's exits and at the routes around this mode
        (``boundary.exits``) record their refusals in the ``refused`` of ``active_limit()``."""

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            """False: torch would wrap ``__torch_dispatch__`` with ``torch._dynamo.disable``,
            importing ``torch._dynamo`` (a second) at the first operation, under learner code,
            where a cell could have put a module of its own in its place and skipped every
            check. The frames are kept out of dynamo below instead."""
            return False

        def __init__(self, allowed: Iterable[str]):
            super().__init__()
            self.allowed = frozenset(allowed)
            self.refused: list[str] = []
            self.verdicts: dict = {}    # operation -> (allowed, its work counters), once a call
            self.largest = 0            # bytes of the largest tensor an operation allocated
            self.work = CallWork()

        def __enter__(self):
            _ACTIVE.append(self)
            return super().__enter__()

        def __exit__(self, *exc_info):
            _ACTIVE.remove(self)
            return super().__exit__(*exc_info)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            verdict = self.verdicts.get(func)
            if verdict is None:
                name = operation_name(func)
                verdict = self.verdicts[func] = (name in self.allowed, _PRODUCT_FLOPS.get(name),
                                                 _EXP_ELEMENTS.get(name), name in LIFTS,
                                                 name == "aten._local_scalar_dense", _fresh(func))
            allowed, flops, exps, lift, read, fresh = verdict
            if _PAUSED[0]:
                return func(*args, **(kwargs or {}))
            if types:   # only plain tensors here: a subclass's handler runs with this mode off
                if SUBCLASS not in self.refused:
                    self.refused.append(SUBCLASS)
                raise ForbiddenOperationError([SUBCLASS])
            if not allowed:
                name = operation_name(func)
                if name not in self.refused:
                    self.refused.append(name)
                raise ForbiddenOperationError([name])
            out = func(*args, **(kwargs or {}))
            made = out.untyped_storage().nbytes() if lift else \
                _allocated(out, args, kwargs, self.largest)
            self.largest = max(self.largest, made)
            if lift or fresh:
                self.work.allocated_bytes += sum(s.nbytes() for s in _storages(out))
            if flops is not None:
                matmul, elementwise = flops(args, kwargs or {}, out)
                self.work.matmul_flops += matmul
                self.work.elementwise_flops += elementwise
            if exps is not None:
                self.work.exp_elements += exps(args, out)
            self.work.scalar_reads += read
            return out

    # dynamo (torch.compile in a cell) never traces the dispatch, nor what it calls: what
    # torch._dynamo.disable(recursive=True) does, set on the code object through torch._C
    skip = eval_frame._FrameAction.SKIP
    eval_frame.set_code_exec_strategy(OperationLimit.__torch_dispatch__.__code__,
                                      eval_frame._FrameExecStrategy(skip, skip))
    return OperationLimit


def _fresh(func: Any) -> bool:
    """Whether every output of the operation is new memory, no view or in-place result of an
    input (its schema's returns carry no alias annotation)."""
    schema = getattr(func, "_schema", None)
    return schema is not None and all(r.alias_info is None for r in schema.returns)


def _storages(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _storages(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _storages(v)]
    return [value.untyped_storage()] if isinstance(value, torch.Tensor) else []


def _allocated(out: Any, args: tuple, kwargs: dict | None, above: int) -> int:
    """Bytes of the largest tensor in ``out`` whose storage is new (not a view of an input),
    when larger than ``above`` (else 0: the inputs are looked at only for a new largest)."""
    larger = [s for s in _storages(out) if s.nbytes() > above]
    if not larger:
        return 0
    inputs = {s.data_ptr() for s in _storages((args, kwargs or {})) if s.nbytes()}
    return max((s.nbytes() for s in larger if s.data_ptr() not in inputs), default=0)


def operation_limit(allowed: Iterable[str] | None):
    """A context manager limiting learner code to the operations ``allowed`` and recording
    the call's largest allocation and work (``None``: no limit, nothing recorded; its
    ``refused`` is then always empty, its ``work`` zero)."""
    if allowed is None:
        return _NoLimit()
    return _limit_mode()(allowed)


def dispatch_places() -> dict[str, Any]:
    """What a dispatch mode rests on beyond its class, by place name (for ``traffic.tampered``):
    torch's mode module and base class, and the dispatch-stack functions of ``torch._C``
    (looked up live)."""
    from torch.utils import _python_dispatch
    return {"python_dispatch": vars(_python_dispatch),
            "TorchDispatchMode": vars(_python_dispatch.TorchDispatchMode),
            "dispatch_stack": _LiveNames(torch._C, DISPATCH_STACK)}


DISPATCH_STACK = ("_push_on_torch_dispatch_stack", "_pop_torch_dispatch_stack",
                  "_get_dispatch_stack_at", "_len_torch_dispatch_stack", "_set_dispatch_mode",
                  "_get_dispatch_mode", "_unset_dispatch_mode")


class _LiveNames:
    """The attributes ``names`` of ``owner`` as a read-only mapping, looked up at every ``items()``."""

    def __init__(self, owner: Any, names: Iterable[str]):
        self.owner, self.names = owner, tuple(names)

    def items(self) -> list[tuple[str, Any]]:
        return [(name, getattr(self.owner, name, None)) for name in self.names]


class _NoLimit(contextlib.nullcontext):
    refused: list[str] = []
    largest = 0

    def __init__(self):
        super().__init__()
        self.work = CallWork()
