"""Shared by tests/test_structure.py and tests/grading/test_autograder_structure.py: modules on an
import cycle in a graph of ``module -> the modules it imports``."""
from __future__ import annotations


def modules_on_cycles(graph: dict[str, set[str]]) -> list[str]:
    """The modules from which the graph leads back to themselves, sorted."""
    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module == goal:
                return True
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])
        return False

    return sorted(m for m in graph if reaches(m, m))
