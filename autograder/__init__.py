"""Autograder of the course: ``check(fn)`` for notebooks, ``python -m autograder grade`` for
instructors. See ``autograder/README.md``."""


def check(obj) -> None:
    """Run the grader tests of the exercise ``obj.__name__`` against the notebook's objects and
    print what passes and what to fix (see ``autograder.local.check``)."""
    from autograder.local import check as _check
    _check(obj)


__all__ = ["check"]
