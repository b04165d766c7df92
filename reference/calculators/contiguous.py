"""The pre-paging KV allocator: one contiguous run of slots per request, reserved for its maximum length.

A request's length is unknown when it starts, so a contiguous allocator must reserve room for the
longest it may grow (prompt + max_tokens). The unused end of each reservation is *tail slack*
(internal fragmentation); a finished request leaves a gap that a larger request cannot use, a
*hole* (external fragmentation). `reference.paging.BlockManager` is the paged alternative;
`reference.calculators.fragmentation` compares the two.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from reference.calculators.memory import whole_number
from reference.paging import OutOfBlocks


class OutOfSlots(OutOfBlocks):
    """No free run of slots is long enough for the reservation; no state was changed."""


@dataclass
class Region:
    """One request's reservation: slots start .. start + reserved - 1, of which the first `used` hold tokens."""
    start: int
    reserved: int
    used: int


class ContiguousAllocator:
    """First-fit allocator of contiguous slot runs over a pool of `num_slots` token slots."""

    def __init__(self, num_slots: int):
        try:   # whole-number floats (4096.0) are accepted; ValueError for anything else
            self.num_slots = whole_number("num_slots", num_slots, minimum=1)
        except TypeError as error:
            raise ValueError(str(error)) from None
        self.regions: dict[Hashable, Region] = {}

    def free_runs(self) -> list[tuple[int, int]]:
        """Maximal runs of free slots as (start, length), in address order."""
        runs, cursor = [], 0
        for region in sorted(self.regions.values(), key=lambda r: r.start):
            if region.start > cursor:
                runs.append((cursor, region.start - cursor))
            cursor = region.start + region.reserved
        if cursor < self.num_slots:
            runs.append((cursor, self.num_slots - cursor))
        return runs

    def can_allocate(self, reserve: int) -> bool:
        """Whether some free run holds `reserve` slots."""
        return self._first_fit(reserve) is not None

    def allocate(self, req_id: Hashable, n_tokens: int, reserve: int) -> int:
        """Reserve `reserve` contiguous slots for a request holding `n_tokens` now; returns the first slot."""
        if req_id in self.regions:
            raise ValueError(f"request {req_id!r} already holds slots; free it first or pick a new id")
        if not 0 < n_tokens <= reserve:
            raise ValueError(f"need 0 < n_tokens <= reserve, got n_tokens={n_tokens}, reserve={reserve}")
        start = self._first_fit(reserve)
        if start is None:
            largest = max((length for _, length in self.free_runs()), default=0)
            raise OutOfSlots(f"request {req_id!r} needs {reserve} contiguous slots; the largest free run "
                             f"is {largest} (free in total: {self.num_slots - self.reserved_slots})")
        self.regions[req_id] = Region(start, reserve, n_tokens)
        return start

    def append(self, req_id: Hashable) -> int:
        """One more token for the request; returns its slot. Growing past the reservation is an error."""
        region = self._region(req_id)
        if region.used == region.reserved:
            raise ValueError(f"request {req_id!r} is at its reservation of {region.reserved} slots")
        region.used += 1
        return region.start + region.used - 1

    def free(self, req_id: Hashable) -> None:
        self._region(req_id)
        del self.regions[req_id]

    def slot(self, req_id: Hashable, position: int) -> int:
        """Physical slot of token `position` of the request: start + position."""
        region = self._region(req_id)
        if not 0 <= position < region.used:
            raise ValueError(f"position must lie in [0, {region.used}) for request {req_id!r}, got {position}")
        return region.start + position

    @property
    def live_tokens(self) -> int:
        return sum(r.used for r in self.regions.values())

    @property
    def reserved_slots(self) -> int:
        return sum(r.reserved for r in self.regions.values())

    @property
    def holes(self) -> int:
        """Free slots below the end of the highest reservation: gaps left behind by finished requests."""
        top = max((r.start + r.reserved for r in self.regions.values()), default=0)
        return sum(min(length, top - start) for start, length in self.free_runs() if start < top)

    def _first_fit(self, reserve: int) -> int | None:
        return next((start for start, length in self.free_runs() if length >= reserve), None)

    def _region(self, req_id: Hashable) -> Region:
        try:
            return self.regions[req_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown request {req_id!r}: allocate it first") from None
