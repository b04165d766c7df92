"""Why learner code failed: ``describe`` turns a learner exception into the one-line cause
shown in a failed test (worker side), ``LearnerError`` carries it (grader side)."""
from __future__ import annotations

import traceback

NOT_IMPLEMENTED = "not implemented yet (the stub still raises NotImplementedError)"


class LearnerError(AssertionError):
    """The learner's code failed (exception, time-out, crash, memory). ``str()`` is the cause.

    Subclasses ``AssertionError`` so that a grader test fails (not errors) with this message.
    """


class OperationRefused(LearnerError):
    """The learner's code ran torch operations its exercise does not allow (``names``): the
    exercise scores 0 (``rule`` is said on its other tests, as for a failed prerequisite)."""
    rule = "only the operations the exercise allows"

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = list(names)


def learner_frame(exc: BaseException) -> str:
    """`` (line N of cell `x`: code)`` for the deepest frame in learner code, or ``""``; looked
    for in ``exc``, then in the exception it was raised during (a refusal re-raised after the
    learner's call ended)."""
    frames = [f for e in (exc, exc.__context__) if e is not None
              for f in reversed(traceback.extract_tb(e.__traceback__))]
    for frame in frames:
        name = frame.filename
        cell = "/learner_cells/" in name
        if cell or "ipykernel_" in name or name.startswith("<ipython"):
            where = f"cell `{name.rsplit('/', 1)[-1][:-3]}`" if cell else "your notebook"
            code = f": {frame.line.strip()}" if frame.line else ""
            return f" (line {frame.lineno} of {where}{code})"
    return ""


def is_out_of_memory(exc: BaseException) -> bool:
    """True for MemoryError and torch's "can't allocate memory" RuntimeError."""
    text = str(exc)
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and ("can't allocate" in text or "not enough memory" in text))


def describe(exc: BaseException, memory_mb: int | None = None) -> str:
    """One-line cause for a learner exception (message truncated to 500 characters)."""
    if isinstance(exc, NotImplementedError) or isinstance(exc.__cause__, NotImplementedError) \
            or (type(exc).__name__ == "InterpreterError" and "NotImplementedError" in str(exc)):
        return NOT_IMPLEMENTED  # (Triton's interpreter wraps what a kernel body raises)
    if is_out_of_memory(exc):
        limit = f"memory limit ({memory_mb} MB) exceeded" if memory_mb else "out of memory"
        return f"{limit}{learner_frame(exc)}"
    try:
        message = str(exc)
    except Exception:  # a hostile __str__
        message = "<unprintable message>"
    message = " ".join(message.split())
    if len(message) > 500:
        message = message[:500] + "…"
    return f"your code raised {type(exc).__name__}: {message}{learner_frame(exc)}"
