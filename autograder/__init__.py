"""Autograder of the course: ``check(fn)`` for notebooks, ``python -m autograder grade`` for
instructors. See ``autograder/README.md``."""


def check(obj, seed: int | None = None) -> None:
    """Run the grader tests of the exercise ``obj.__name__`` against the notebook's objects,
    print what passes and what to fix, and raise ``AssertionError`` if a test fails (see
    ``autograder.local.check``)."""
    from autograder.local import check as _check
    _check(obj, seed)


__all__ = ["check"]
