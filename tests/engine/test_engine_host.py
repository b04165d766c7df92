"""The engine step's host work, done in bulk, equals the per-token reference: slots and appends a
block at a time, the step's tensors packed at once, batched sampling (bit for bit, generators
included); the engine's host/model clocks and the engine-host benchmark."""
import random

import pytest
import torch

from reference.decoding import filtered_probs as reference_filtered_probs, sample_next
from reference.engine import LLM, SamplingParams
from reference.engine.runner import int_tensor
from reference.engine.sampler import TOP_P_CANDIDATES, Sampler, _top_p_from_largest, filtered_probs
from reference.model import build_tiny
from reference.paging import BlockManager, OutOfBlocks
from reference.tokenizer import ByteTokenizer


def random_manager(rng: random.Random, block_size: int) -> tuple[BlockManager, list[str]]:
    """A pool with prefix-cache hits, forks (shared tails), partial and full tail blocks."""
    m = BlockManager(200, block_size)
    shared = [rng.randrange(50) for _ in range(3 * block_size)]
    ids = []
    for i in range(8):
        prompt = shared[:rng.randrange(1, len(shared))] + [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
        m.allocate(f"s{i}", prompt)
        for _ in range(rng.randrange(0, 2 * block_size)):
            m.append_token(f"s{i}", rng.randrange(50))
        ids.append(f"s{i}")
        if rng.random() < 0.3:
            m.fork(f"s{i}", f"f{i}")
            ids.append(f"f{i}")
    return m, ids


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_slots_a_block_at_a_time_equal_the_per_slot_mapping(block_size):
    rng = random.Random(block_size)
    for _ in range(20):
        m, ids = random_manager(rng, block_size)
        for seq_id in ids:
            n = m.num_tokens(seq_id)
            for start, end in [(0, n), (n - 1, n), (rng.randrange(n), n)] + [sorted(rng.sample(range(n + 1), 2))]:
                assert m.slots(seq_id, start, end) == m.slot_mapping(seq_id, start, end)   # partial blocks too
    assert m.slots(ids[0], 3, 3) == [] == m.slot_mapping(ids[0], 3, 3)
    with pytest.raises(ValueError, match="positions"):
        m.slots(ids[0], 0, m.num_tokens(ids[0]) + 1)
    with pytest.raises(ValueError, match="unknown sequence"):
        m.slots("nobody", 0, 1)


def state(m: BlockManager):
    """Everything a sequence of appends may change."""
    return (m._tables, m._tokens, m._hashes, m.free_block_ids, m.cache.idle_blocks(), m._refs,
            m.cache._block_of, m.cache._hash_of, m.prefix_hits, m.prefix_misses, m.evictions)


@pytest.mark.parametrize("seed", range(6))
def test_append_tokens_equals_append_token_one_at_a_time(seed):
    """Twin managers, the same random history (prefix hits, forks, small pools, truncations,
    frees); one appends token by token, the other in bulk: same state, copies and stopping point."""
    rng = random.Random(seed)
    block_size, num_blocks = rng.choice([1, 2, 4, 5]), rng.randrange(6, 30)
    twins = [BlockManager(num_blocks, block_size) for _ in range(2)]
    live, next_id = [], 0
    for _ in range(150):
        action = rng.random()
        if action < 0.25 or not live:
            prompt = [rng.randrange(4) for _ in range(rng.randrange(1, 3 * block_size))]
            try:
                for m in twins:
                    m.allocate(next_id, prompt)
                live.append(next_id)
            except OutOfBlocks:
                pass
            next_id += 1
        elif action < 0.35:
            parent = rng.choice(live)
            for m in twins:
                m.fork(parent, next_id)
            live.append(next_id)
            next_id += 1
        elif action < 0.45:
            victim = live.pop(rng.randrange(len(live)))
            for m in twins:
                m.free(victim)
        elif action < 0.5:
            seq_id = rng.choice(live)
            keep = rng.randrange(1, twins[0].num_tokens(seq_id) + 1)
            for m in twins:
                m.truncate(seq_id, keep)
        else:
            seq_id = rng.choice(live)
            tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 4 * block_size))]
            one, copies_one = 0, []
            for token in tokens:
                try:
                    copy = twins[0].append_token(seq_id, token)
                except OutOfBlocks:
                    break
                one += 1
                copies_one += [copy] if copy is not None else []
            assert twins[1].append_tokens(seq_id, tokens) == (one, copies_one)
        assert state(twins[0]) == state(twins[1])
    before = repr(state(twins[1]))
    for bad in ([1, -2], [1, 2.0]):
        with pytest.raises((TypeError, ValueError)):
            twins[1].append_tokens(live[0], bad)
        assert repr(state(twins[1])) == before, "a bad token id changed the state"


def test_int_tensor_equals_torch_tensor():
    for values in ([], [0], [5, -1, 2 ** 40], list(range(1000))):
        assert torch.equal(int_tensor(values), torch.tensor(values, dtype=torch.int64))
    small = [3, -1, 7]
    assert torch.equal(int_tensor(small, torch.int32), torch.tensor(small, dtype=torch.int32))


def test_top_p_from_the_largest_probabilities_equals_the_full_sort():
    """Bit for bit, on a real-sized vocabulary (mostly the fast path) and with ties at the cut."""
    gen = torch.Generator().manual_seed(0)
    decided = 0
    for trial in range(24):
        logits = torch.randn(49152, generator=gen) * (0.5, 2.0, 6.0)[trial % 3]
        if trial % 4 == 0:
            logits = (logits * 2).round()                  # many exactly equal probabilities
        temperature = (0.7, 1.0, 1.5)[trial % 3]
        top_k = (None, 40, 5000)[trial % 3 if trial % 5 else 0]
        top_p = (0.3, 0.9, 0.95, 0.999)[trial % 4]
        assert torch.equal(filtered_probs(logits, temperature, top_k, top_p),
                           reference_filtered_probs(logits, temperature, top_k, top_p))
        probs = reference_filtered_probs(logits, temperature, top_k)
        decided += _top_p_from_largest(probs, top_p, TOP_P_CANDIDATES[-1] + 1) is not None
    assert decided >= 12, "the fast path should settle most of these cases"
    tied = torch.zeros(49152)
    tied[:600] = 1.0                                       # a tie cut by the nucleus: sort decides
    assert _top_p_from_largest(torch.softmax(tied, -1), 0.5, 2049) is None
    assert torch.equal(filtered_probs(tied, 1.0, None, 0.5), reference_filtered_probs(tied, 1.0, None, 0.5))


@pytest.mark.parametrize("vocab,threads", [(256, 1), (49152, 1), (49152, 2)])
def test_batched_sampling_equals_sample_next_row_by_row(vocab, threads):
    """Greedy and sampled rows mixed: each row's token is sample_next's, and each generator is
    left where sample_next (torch.multinomial) leaves it, whether the draws run one after the
    other or on two threads at once."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab, generator=gen) * 3
    params = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=1),
              SamplingParams(temperature=1.0, seed=2), SamplingParams(temperature=1.2, top_k=20, seed=3),
              SamplingParams(), SamplingParams(temperature=0.5, top_k=50, top_p=0.95, seed=4),
              SamplingParams(temperature=1.0, top_p=0.999, seed=5), SamplingParams(temperature=2.0, seed=6),
              SamplingParams()]
    ours = [torch.Generator().manual_seed(100 + b) for b in range(len(params))]
    theirs = [torch.Generator().manual_seed(100 + b) for b in range(len(params))]
    for _ in range(3):
        got = Sampler(threads)(logits, params, ours)
        want = [sample_next(row, *p.filters, g) for row, p, g in zip(logits, params, theirs)]
        assert got == want
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs))
    assert Sampler()(logits[:0], [], []) == []


def test_engine_reports_host_and_model_seconds():
    model, tok = build_tiny(0), ByteTokenizer()
    llm = LLM(model, tokenizer=tok, block_size=4, num_blocks=100)
    llm.generate(["abc", "hello there"], SamplingParams(max_tokens=5))
    stats = llm.engine.stats
    assert stats["model_seconds"] > 0 and stats["host_seconds"] > 0


def test_engine_host_benchmark_prints_its_table(capsys):
    from reference.bench.__main__ import main
    main(["engine-host", "--model", "tiny", "--batch", "1", "3", "--steps", "3", "--threads", "1"])
    out = capsys.readouterr().out
    for column in ("step ms", "model ms", "host ms", "host %", "greedy", "top-p", "free cores"):
        assert column in out, out
    assert len([line for line in out.splitlines() if line.startswith(("greedy", "top-p"))]) == 4
