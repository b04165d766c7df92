"""Fixtures of the chapter graders.

Under the autograder (``python -m autograder grade``) ``learner`` and ``seed`` come from the
grading plugin. Run directly (``python -m pytest autograder/graders/ch01_naive_decoding.py``)
the tests grade the solution file ``autograder/solutions/ch01_naive_decoding.py`` in-process,
under each test's exercise (its forbidden functions, its operation limit and the work and memory
it records), with the seed from ``$AUTOGRADER_SEED`` (default 0) — the quickest way to check a
grader.
"""
import os
from pathlib import Path

import pytest

from autograder.local import LocalLearner
from autograder.rules.plugin import COLLECTOR, REGISTRY

SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"


@pytest.fixture
def learner(request):
    """The learner under test (``SandboxLearner`` when grading, else ``LocalLearner``)."""
    collector = request.config.stash.get(COLLECTOR, None)
    if collector is not None:
        return collector.learner
    solution = SOLUTIONS / request.path.name
    if not solution.exists():
        pytest.skip(f"no solution file {solution} to grade")
    learner = LocalLearner.from_file(solution)
    mark = request.node.get_closest_marker("exercise")
    if mark:
        learner.begin(REGISTRY[mark.args[0]])
    return learner


@pytest.fixture
def seed(request) -> int:
    """Seed of the grading run (``torch.Generator().manual_seed(seed)`` draws the inputs)."""
    collector = request.config.stash.get(COLLECTOR, None)
    return collector.seed if collector is not None else int(os.environ.get("AUTOGRADER_SEED", 0))
