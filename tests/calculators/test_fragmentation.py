"""Contiguous allocator and the fragmentation simulator: the 64-slot walkthrough, random workloads."""
import math

import pytest

from reference.calculators.contiguous import ContiguousAllocator, OutOfSlots
from reference.calculators.fragmentation import (WALKTHROUGH, WALKTHROUGH_BLOCK_SIZE, WALKTHROUGH_SLOTS, Arrive,
                                                 ContiguousPool, Finish, Grow, PagedPool, Request, random_workload,
                                                 replay, simulate)


def test_first_fit_reuses_a_hole_only_when_it_is_long_enough():
    a = ContiguousAllocator(32)
    assert [a.allocate(r, 1, 8) for r in "abc"] == [0, 8, 16]
    a.free("b")
    assert a.free_runs() == [(8, 8), (24, 8)] and a.holes == 8
    assert a.allocate("d", 2, 6) == 8                      # fits the hole
    assert a.allocate("e", 1, 8) == 24                     # the 2 slots left in the hole are too few
    assert a.holes == 2 and not a.can_allocate(3)
    assert [a.append("d"), a.slot("d", 2)] == [10, 10]
    assert (a.live_tokens, a.reserved_slots) == (6, 30)


def test_contiguous_errors_are_clear_and_change_nothing():
    a = ContiguousAllocator(16)
    a.allocate("a", 2, 2)
    with pytest.raises(OutOfSlots, match="largest free run is 14"):
        a.allocate("b", 1, 15)
    for error_message, call in [("already", lambda: a.allocate("a", 1, 1)),
                                ("n_tokens", lambda: a.allocate("c", 3, 2)),
                                ("reservation", lambda: a.append("a")),
                                ("unknown", lambda: a.free("zz")),
                                ("position", lambda: a.slot("a", 2)),
                                ("num_slots", lambda: ContiguousAllocator(0))]:
        with pytest.raises(ValueError, match=error_message):
            call()
    assert a.free_runs() == [(2, 14)]


def expected_walkthrough():
    """Per step, what each pool must show, computed from the events by a slot-by-slot model: an
    owner per slot with first fit by scanning for contiguous; ceil(tokens / block size) whole
    blocks per request for paged."""
    n, b = WALKTHROUGH_SLOTS, WALKTHROUGH_BLOCK_SIZE
    owner, tokens, paged_tokens, rows = [None] * n, {}, {}, []
    for _, events in WALKTHROUGH:
        refused = []
        for e in events:
            if isinstance(e, Arrive):
                paged_tokens[e.req_id] = e.prompt_len
                start = next((s for s in range(n - e.max_len + 1)
                              if all(o is None for o in owner[s:s + e.max_len])), None)
                if start is None:
                    refused.append(e.req_id)
                    continue
                owner[start:start + e.max_len] = [e.req_id] * e.max_len
                tokens[e.req_id] = e.prompt_len
            elif isinstance(e, Grow):
                tokens[e.req_id] += e.n_tokens
                paged_tokens[e.req_id] += e.n_tokens
            elif isinstance(e, Finish):
                owner = [None if o == e.req_id else o for o in owner]
                del tokens[e.req_id], paged_tokens[e.req_id]
        top = max((i + 1 for i, o in enumerate(owner) if o is not None), default=0)
        contiguous = (sum(tokens.values()), n - owner.count(None), owner[:top].count(None))
        paged = (sum(paged_tokens.values()), sum(math.ceil(t / b) * b for t in paged_tokens.values()), 0)
        rows.append((contiguous, paged, tuple(refused)))
    return rows


def test_walkthrough_64_slots_as_16_blocks_of_4():
    contiguous = replay(WALKTHROUGH, ContiguousPool(WALKTHROUGH_SLOTS))
    paged = replay(WALKTHROUGH, PagedPool(WALKTHROUGH_SLOTS, WALKTHROUGH_BLOCK_SIZE))
    for c, p, (want_c, want_p, refused) in zip(contiguous, paged, expected_walkthrough()):
        assert (c.stats.live, c.stats.held, c.stats.holes) == want_c, c.title
        assert (p.stats.live, p.stats.held, p.stats.holes) == want_p, p.title
        assert c.refused == refused and p.refused == ()
        assert p.stats.tail_slack <= p.stats.requests * (WALKTHROUGH_BLOCK_SIZE - 1)
    last_c, last_p = contiguous[-1].stats, paged[-1].stats
    assert contiguous[-1].refused == ("D",) and last_c.free >= 20 > last_c.total - last_c.held - last_c.holes
    assert last_p.utilisation > last_c.utilisation and any(c.stats.holes for c in contiguous)


@pytest.mark.parametrize("seed, rate", [(0, None), (1, None), (2, 0.5), (3, 0.25)])
def test_paged_beats_contiguous_on_pareto_workloads(seed, rate):
    requests = random_workload(120, seed=seed, arrivals_per_step=rate)
    contiguous = simulate(requests, ContiguousPool(2048))
    paged = simulate(requests, PagedPool(2048, block_size=16))
    for result in (contiguous, paged):
        assert sorted(result.finish_step) == [r.req_id for r in requests]
        for s in result.stats:
            assert s.live + s.tail_slack + s.free == s.total and 0 <= s.holes <= s.free
    assert all(s.tail_slack <= s.requests * 15 and s.holes == 0 for s in paged.stats)
    assert paged.mean_utilisation > contiguous.mean_utilisation
    assert paged.steps <= contiguous.steps
    assert paged.fragmentation_stalls == 0 < contiguous.fragmentation_stalls


def test_a_small_paged_pool_preempts_and_still_finishes_every_request():
    requests = [Request(i, 0, 20, 40, 40) for i in range(6)]
    result = simulate(requests, PagedPool(128, block_size=8))
    assert result.preemptions > 0 and len(result.finish_step) == 6
    assert max(s.held for s in result.stats) <= 128


def test_simulate_rejects_impossible_requests():
    with pytest.raises(ValueError, match="never fit"):
        simulate([Request(0, 0, 10, 5, 100)], ContiguousPool(64))
    with pytest.raises(ValueError, match="output_len"):
        simulate([Request(0, 0, 10, 5, 4)], PagedPool(64, 4))
    with pytest.raises(ValueError, match="multiple"):
        PagedPool(60, 16)


def test_command_line_prints_the_walkthrough_and_a_workload(capsys):
    from reference.calculators.fragmentation import main
    main()
    out = capsys.readouterr().out
    assert "refused D" in out and out.count("mean utilisation") == 2
