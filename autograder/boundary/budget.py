"""Grader side: the learner time a submission may spend, over all its calls and restarts."""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

from autograder.boundary.causes import LearnerError


class TimeBudget:
    """``total`` seconds of learner time for one submission; ``spent`` counts every call and
    every worker start (a submission that crashes every call must not stall the grader)."""

    def __init__(self, total: float):
        self.total, self.spent = total, 0.0

    @property
    def left(self) -> float:
        return self.total - self.spent

    def require(self) -> None:
        """``LearnerError`` when nothing is left: the test that wanted to run is not run."""
        if self.left <= 0:
            raise LearnerError(f"time budget exhausted ({self.total:g} s for the whole "
                               "submission): this test was not run")

    @contextlib.contextmanager
    def charged(self) -> Iterator[float]:
        """Charge the time spent inside the block; yields its start (``time.monotonic``)."""
        start = time.monotonic()
        try:
            yield start
        finally:
            self.spent += time.monotonic() - start
