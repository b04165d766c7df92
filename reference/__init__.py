"""The course's reference implementation.

The modules at this level, `engine/` and `kernels/` are what the book teaches; `cpu/` is the fast
CPU path built from the plain model (`reference.cpu.CpuModel`); `calculators/` holds the
chapters' pen-and-paper models (bytes, roofline, simulators) and `bench/` everything that
measures (CONTRIBUTING.md has the map). The core never imports from `bench/`.

Importing it changes nothing in the process: how many threads decoding uses, and how that follows
a load that comes and goes, is reference/threads.py.
"""
import importlib.abc
import os
import sys

# Modules that moved when reference/ was split by role, and when the fast CPU path left the model
# for reference/cpu: old name -> new name. Importing an old name fails with a message naming the
# new place (a reader's notebook may still use it).
MOVED = {
    "reference.memory": "reference.calculators.memory",
    "reference.hardware": "reference.calculators.hardware",
    "reference.roofline": "reference.calculators.roofline",
    "reference.batching_sim": "reference.calculators.batching_sim",
    "reference.fragmentation": "reference.calculators.fragmentation",
    "reference.contiguous": "reference.calculators.contiguous",
    "reference.kernels.versions": "reference.calculators.flash_versions",
    "reference.roofline_measure": "reference.bench.machine",
    "reference.measure": "reference.bench.measure",
    "reference.pass_bench": "reference.bench.passes",
    "reference.batch_bench": "reference.bench.batch",
    "reference.host_bench": "reference.bench.host",
    "reference.serve_bench": "reference.bench.serve",
    "reference.serve_workload": "reference.bench.workload",
    "reference.spec_bench": "reference.bench.speculative",
    "reference.kernels.bench": "reference.bench.kernels",
    "reference.composition": "reference.bench.composition",
    "reference.hf_peer": "reference.bench.hf_peer",
    "reference.prose": "reference.bench.prose",
    "reference.native_step": "reference.cpu.native_step",
    "reference.native_batch": "reference.cpu.native_batch",
    "reference.native_gemv": "reference.cpu.native_gemv",
    "reference.native_attention": "reference.cpu.native_attention",
    "reference.cpu_linear": "reference.cpu.cpu_linear",
    "reference.huge_pages": "reference.cpu.huge_pages",
}


class _MovedModules(importlib.abc.PathEntryFinder):
    """The finder of a marker entry on a package's `__path__` (`_report_moved`): an old name fails
    with a message naming the new place; any other name goes on to the package's directory."""

    def find_spec(self, fullname, target=None):
        if fullname in MOVED:
            # no name=: `from reference import memory` would then turn it into "cannot import name"
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
