"""Autograder of the course: ``check(fn)`` for notebooks, ``python -m autograder grade`` for
instructors. See ``autograder/README.md``.

By role: the front-ends here (``cli``, ``grading``, ``report``, ``notebook``,
``source_notebook``, ``gradescope_zip``, ``bench``), the learner API (``learner``: one interface,
run in a sandboxed process by ``sandbox`` or in this one by ``local``), what a grader applies in
``rules/``, the process boundary that learner code runs behind in ``boundary/``, the chapter graders in
``graders/`` and the solutions in ``solutions/``.
"""
import importlib.abc
import os
import sys

# Modules that moved when autograder/ was split by role: old name -> new name. Importing an old
# name fails with a message naming the new place (a grader file or notebook may still use it).
MOVED = {
    "autograder.plugin": "autograder.rules.plugin",
    "autograder.feedback": "autograder.rules.feedback",
    "autograder.forbid": "autograder.rules.forbid (the run-time guard: autograder.boundary.guard)",
    "autograder.kernel_rules": "autograder.rules.kernel_rules",
    "autograder.inputs": "autograder.rules.inputs",
    "autograder.errors": "autograder.boundary.causes (PrerequisiteFailed: autograder.rules.feedback)",
    "autograder.boundary.sandbox": "autograder.sandbox (the Learner it implements: autograder.learner)",
    "autograder.worker": "autograder.boundary.worker",
    "autograder.confine": "autograder.boundary.confine",
    "autograder.isolation": "autograder.boundary.isolation",
    "autograder.launching": "autograder.boundary.launching",
    "autograder.protocol": "autograder.boundary.protocol",
    "autograder.proxies": "autograder.boundary.proxies",
    "autograder.refs": "autograder.boundary.refs",
    "autograder.store": "autograder.boundary.store",
}


class _MovedModules(importlib.abc.PathEntryFinder):
    """The finder of a marker entry on a package's `__path__` (`_report_moved`): an old name fails
    with a message naming the new place; any other name goes on to the package's directory."""

    def find_spec(self, fullname, target=None):
        if fullname in MOVED:
            raise ModuleNotFoundError(f"{fullname} has moved: import {MOVED[fullname]} instead")
        return None


def _report_moved(package_path: list[str]) -> None:
    """Make a package's moved modules fail clearly when imported: a marker entry first on the
    package's own `__path__`, whose finder (kept where the import system keeps each path entry's
    finder, sys.path_importer_cache) is `_MovedModules`. Only imports of the package's own modules
    look there; sys.meta_path and sys.path_hooks stay as they were."""
    marker = os.path.join(package_path[-1], "(moved modules)")
    sys.path_importer_cache[marker] = _MovedModules()
    package_path.insert(0, marker)


_report_moved(__path__)


def check(obj, seed: int | None = None) -> None:
    """Run the grader tests of the exercise ``obj.__name__`` against the notebook's objects,
    print what passes and what to fix, and raise ``AssertionError`` if a test fails (see
    ``autograder.local.check``)."""
    from autograder.local import check as _check
    _check(obj, seed)


__all__ = ["check"]
