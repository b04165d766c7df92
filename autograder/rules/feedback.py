"""Assertions whose failure messages teach. Every function raises ``AssertionError``.

``name`` is how the message refers to the checked value (e.g. ``"logits"`` or
``"naive_generate(...)"``); ``hint`` (optional) is appended as ``Hint: ...`` and names a
recognised common mistake. ``PrerequisiteFailed`` is for the method, not a number.
"""
from __future__ import annotations

from typing import Any

import torch

from autograder.boundary.refs import Handle


class PrerequisiteFailed(AssertionError):
    """Raised by a grader test when a submission does not follow the exercise's method (e.g. it
    holds the whole score matrix where the exercise is to work tile by tile): the plugin then
    scores every test of that exercise 0, those that passed saying why (``plugin.apply_gates``).
    ``rule``: the method in a few words, repeated on those tests."""

    def __init__(self, message: str, rule: str):
        super().__init__(message)
        self.rule = rule


def _fail(message: str, hint: str | None) -> None:
    raise AssertionError(f"{message}\nHint: {hint}" if hint else message)


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "floating-point" if dtype.is_floating_point else "integer"


def _describe_type(value: Any) -> str:
    if isinstance(value, Handle):
        return "an object (not plain data)"
    return f"{type(value).__name__} {_short(value)}"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _excerpt(t: torch.Tensor, flat_index: int, width: int = 3) -> list:
    flat = t.reshape(-1)
    lo = max(0, flat_index - width)
    return [round(v, 5) if isinstance(v, float) else v for v in flat[lo:flat_index + width + 1].tolist()]


def assert_close(got: Any, expected: torch.Tensor, *, name: str, rtol: float = 1e-4,
                 atol: float = 1e-5, hint: str | None = None) -> None:
    """Check that ``got`` is a tensor like ``expected``: type, shape, dtype kind (floating /
    integer / bool), no NaN/inf where ``expected`` is finite, then ``|got - expected| <= atol +
    rtol * |expected|`` elementwise. The message gives max abs/rel error, the first mismatching
    index and a few values of expected vs got around it."""
    if not isinstance(got, torch.Tensor):
        _fail(f"`{name}` should be a torch.Tensor but is {_describe_type(got)}", hint)
    if tuple(got.shape) != tuple(expected.shape):
        _fail(f"`{name}` has shape {list(got.shape)} but should have shape {list(expected.shape)}",
              hint)
    if _kind(got.dtype) != _kind(expected.dtype):
        _fail(f"`{name}` has dtype {got.dtype} but should be a {_kind(expected.dtype)} tensor "
              f"({expected.dtype})", hint)
    if got.numel() == 0:
        return
    g, e = got.detach().cpu().to(torch.float64), expected.detach().cpu().to(torch.float64)
    bad_values = ~torch.isfinite(g) & torch.isfinite(e)
    if bad_values.any():
        index = tuple(torch.nonzero(bad_values)[0].tolist())
        _fail(f"`{name}` contains NaN or inf (first at index {list(index)}: {g[index].item()}) "
              f"where the expected value is {e[index].item():.6g}", hint)
    diff = (g - e).abs()
    diff = torch.where(torch.isfinite(e) | (g != e), diff, torch.zeros_like(diff))
    bad = diff > atol + rtol * e.abs()
    if not bad.any():
        return
    first = int(torch.nonzero(bad.reshape(-1))[0])
    index = list(torch.unravel_index(torch.tensor(first), tuple(g.shape)))
    rel = (diff / e.abs().clamp_min(1e-12))[bad].max().item()
    _fail(f"`{name}` is not close to the expected values: {int(bad.sum())} of {bad.numel()} "
          f"elements differ (max abs error {diff.max().item():.3g}, max rel error {rel:.3g}; "
          f"rtol={rtol:g}, atol={atol:g}). First mismatch at index {[int(i) for i in index]}: "
          f"expected {e.reshape(-1)[first].item():.6g}, got {g.reshape(-1)[first].item():.6g}.\n"
          f"  expected …{_excerpt(e, first)}…\n  got      …{_excerpt(g, first)}…", hint)


def _as_token_list(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() <= 1 and not value.is_floating_point():
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, tuple):
        return list(value)
    return value


def assert_equal_tokens(got: Any, expected: list[int], *, name: str,
                        hint: str | None = None) -> None:
    """Check that ``got`` is the token list ``expected`` (a 1-D integer tensor is accepted as a
    list). The message gives the lengths or the first differing position with context."""
    got = _as_token_list(got)
    expected = _as_token_list(expected)
    if not isinstance(got, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in got):
        _fail(f"`{name}` should be a list of int token ids but is {_describe_type(got)}", hint)
    for position, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            lo = max(0, position - 3)
            _fail(f"`{name}` differs from the expected tokens at position {position}: expected "
                  f"{e}, got {g}.\n  expected …{expected[lo:position + 4]}…\n"
                  f"  got      …{got[lo:position + 4]}…", hint)
    if len(got) != len(expected):
        _fail(f"`{name}` has {len(got)} tokens but should have {len(expected)} (the first "
              f"{min(len(got), len(expected))} agree)", hint)


def assert_equal(got: Any, expected: Any, *, name: str, hint: str | None = None) -> None:
    """Check ``got == expected`` for plain values (numbers, strings, lists, dicts, tuples)."""
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        raise TypeError("assert_equal compares plain values; use assert_close for tensors")
    if type(got) is not type(expected) and not (
            isinstance(got, (int, float)) and isinstance(expected, (int, float))
            and not isinstance(got, bool)):
        _fail(f"`{name}` should be a {type(expected).__name__} but is {_describe_type(got)}", hint)
    if got != expected:
        _fail(f"`{name}` is {_short(got)} but should be {_short(expected)}", hint)


def as_number(got: Any, *, name: str, kind: str = "a number") -> float:
    """``got`` (an int, a float or a one-element tensor) as a float; anything else, a bool too,
    fails with "``name`` returned ``got``; expected ``kind``"."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise AssertionError(f"{name} returned {got!r}; expected {kind}")
    return float(got)
