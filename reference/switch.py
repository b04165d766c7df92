"""A process-wide on/off setting for a fast path, read once from the environment."""
from __future__ import annotations

import os


class Switch:
    """On unless the environment variable `variable` is "0" when the module is imported;
    `set_enabled` changes it for the whole process afterwards (tests, benchmarks)."""

    def __init__(self, variable: str):
        self.variable = variable
        self.on = os.environ.get(variable, "1") != "0"

    def enabled(self) -> bool:
        return self.on

    def set_enabled(self, on: bool) -> bool:
        """Switch the path on or off; returns the previous setting."""
        previous, self.on = self.on, bool(on)
        return previous
