"""BlockManager: block tables, refcounts, prefix caching, copy-on-write, errors; a state machine."""
import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reference.paging import BlockManager, OutOfBlocks
from reference.prefix_cache import full_block_hashes


def snapshot(m: BlockManager):
    """Everything an operation that raises must leave untouched."""
    return (dict((s, list(t)) for s, t in m._tables.items()), m.free_block_ids, m.cache.idle_blocks(),
            [m.ref_count(b) for b in range(m.num_blocks)], m.prefix_hits, m.prefix_misses, m.evictions)


def test_allocate_gives_ceil_blocks_and_slots_follow_the_table():
    m = BlockManager(8, block_size=4)
    assert m.allocate("a", list(range(10))) == 0
    table = m.block_table("a")
    assert len(table) == 3 and m.num_free_blocks == 5
    assert [m.slot("a", p) for p in range(10)] == [table[p // 4] * 4 + p % 4 for p in range(10)]
    assert m.slot_mapping("a", 8) == [table[2] * 4, table[2] * 4 + 1]
    assert m.num_tokens("a") == 10


def test_prefix_hit_shares_full_blocks_and_counts():
    m = BlockManager(8, block_size=4)
    m.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert m.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 0, 0]) == 8
    assert m.block_table("b")[:2] == m.block_table("a")[:2]
    assert m.block_table("b")[2] != m.block_table("a")[2]
    assert [m.ref_count(b) for b in m.block_table("a")] == [2, 2, 1]
    assert (m.prefix_hits, m.prefix_misses, m.hit_rate) == (2, 2, 0.5)
    assert m.allocate("c", [1, 2, 3, 5, 5, 6, 7, 8]) == 0   # the first block differs: no hit at all


def test_whole_prompt_hit_still_leaves_the_last_token_to_compute():
    m = BlockManager(8, block_size=4)
    m.allocate("a", list(range(8)))
    assert m.allocate("b", list(range(8))) == 4
    assert m.block_table("b")[0] == m.block_table("a")[0]
    assert m.block_table("b")[1] != m.block_table("a")[1]


def test_freed_full_blocks_stay_cached_until_evicted_lru():
    m = BlockManager(4, block_size=2)
    m.allocate("a", [1, 1, 1, 1])
    a_blocks = m.block_table("a")
    m.free("a")
    assert m.num_free_blocks == 4 and m.cache.num_idle == 2
    m.allocate("b", [2, 2, 2, 2])
    b_blocks = m.block_table("b")
    m.free("b")
    assert m.allocate("a2", [1, 1, 1, 1, 3]) == 4         # a's blocks came back from the cache
    assert m.block_table("a2")[:2] == a_blocks and m.evictions == 1
    assert m.cache.idle_blocks() == [b_blocks[0]]          # LRU: b's tail went first, its head stays
    m.free("a2")
    m.allocate("c", [5, 5, 5, 5, 5, 5, 5, 5])              # needs every block: evicts all idle ones
    assert m.evictions == 4 and m.cache.num_idle == 0
    m.free("c")
    assert m.allocate("a3", [1, 1, 1, 1, 1]) == 0          # a's prefix is gone


def test_append_takes_a_block_only_at_the_boundary():
    m = BlockManager(4, block_size=2)
    m.allocate("a", [7, 7, 7])
    assert m.append_token("a", 7) is None and len(m.block_table("a")) == 2
    assert m.append_token("a", 7) is None and len(m.block_table("a")) == 3
    assert m.slot("a", 4) == m.block_table("a")[2] * 2


def test_blocks_filled_by_appends_are_cached_under_the_chained_hash():
    m = BlockManager(8, block_size=3)
    m.allocate("a", [1, 2, 3])
    for token in (4, 5, 6):
        m.append_token("a", token)
    assert m.allocate("b", [1, 2, 3, 4, 5, 6, 7]) == 6
    assert m.block_table("b")[:2] == m.block_table("a")[:2]
    assert m.allocate("c", [4, 5, 6, 7]) == 0              # same tokens, different prefix: no hit


def test_fork_shares_everything_and_copy_on_write_splits_the_tail():
    m = BlockManager(6, block_size=4)
    m.allocate("p", list(range(6)))
    m.fork("p", "c")
    assert m.block_table("c") == m.block_table("p") and m.num_free_blocks == 4
    src = m.block_table("p")[1]
    assert m.can_append("c")
    copy = m.append_token("c", 9)
    assert copy is not None and copy[0] == src and copy[1] == m.block_table("c")[1] != src
    assert m.block_table("c")[0] == m.block_table("p")[0]
    assert m.append_token("p", 8) is None                   # p owns its tail alone now
    assert m.slot("p", 6) != m.slot("c", 6)


def test_fork_with_a_full_tail_needs_no_copy():
    m = BlockManager(6, block_size=4)
    m.allocate("p", list(range(8)))
    m.fork("p", "c")
    assert m.append_token("c", 1) is None and m.append_token("p", 2) is None
    assert m.block_table("c")[:2] == m.block_table("p")[:2]


@pytest.mark.parametrize("action", ["allocate", "append", "copy_on_write"])
def test_out_of_blocks_changes_nothing(action):
    m = BlockManager(3, block_size=2)
    m.allocate("a", [1, 2, 3])
    m.fork("a", "b")
    m.allocate("c", [4, 4])
    before = snapshot(m)
    with pytest.raises(OutOfBlocks, match="free"):
        if action == "allocate":
            m.allocate("d", [1, 2, 9, 9])                   # one hit, one new block, none free
        elif action == "append":
            m.append_token("c", 1)                          # c's only block is full
        else:
            m.append_token("a", 1)
    assert snapshot(m) == before
    assert not m.can_allocate(1) and not m.can_append("a")


def test_bad_input_is_a_clear_error():
    m = BlockManager(4, block_size=2)
    m.allocate("a", [1])
    cases = [
        (ValueError, "already", lambda: m.allocate("a", [1])),
        (ValueError, "empty", lambda: m.allocate("b", [])),
        (TypeError, "ints", lambda: m.allocate("b", [1.5])),
        (TypeError, "sequence", lambda: m.allocate("b", "hello")),
        (ValueError, r"\[0, 2\*\*63\)", lambda: m.allocate("b", [-1])),
        (ValueError, "unknown", lambda: m.append_token("zz", 1)),
        (ValueError, "unknown", lambda: m.free("zz")),
        (ValueError, "unknown", lambda: m.block_table(["unhashable"])),
        (ValueError, "unknown", lambda: m.fork("zz", "y")),
        (ValueError, "already", lambda: m.fork("a", "a")),
        (ValueError, "position", lambda: m.slot("a", 1)),
        (TypeError, "ints", lambda: m.append_token("a", "x")),
        (ValueError, "num_blocks", lambda: BlockManager(0)),
        (ValueError, "block_size", lambda: BlockManager(4, block_size=2.0)),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()
    assert m.block_table("a") != [] and m.num_tokens("a") == 1


def test_tensor_prompts_and_disabled_prefix_caching():
    m = BlockManager(4, block_size=2, enable_prefix_caching=False)
    m.allocate("a", torch.tensor([1, 2, 3]))
    assert m.allocate("b", [1, 2, 3]) == 0 and m.hit_rate == 0.0
    m.free("a"), m.free("b")
    assert sorted(m.free_block_ids) == [0, 1, 2, 3] and m.cache.num_idle == 0


def test_cached_prefix_holds_the_same_kv_as_a_recompute():
    """Write a prompt's K/V into a paged pool by its slots; a second prompt sharing its first two
    blocks maps to those physical blocks, and they hold exactly what recomputing gives."""
    from reference.model import load_model
    model, _ = load_model("tiny")
    cfg, bs = model.config, 16
    m = BlockManager(num_blocks=8, block_size=bs)
    pools = torch.full((cfg.n_layers, 2, m.num_blocks * bs, cfg.n_kv_heads, cfg.head_dim), float("nan"))
    gen = torch.Generator().manual_seed(0)
    first = torch.randint(0, cfg.vocab_size, (40,), generator=gen)
    second = torch.cat([first[:32], torch.randint(0, cfg.vocab_size, (13,), generator=gen)])

    def prefill_kv(ids):
        cache = model.new_cache(batch=1, max_len=len(ids))
        with torch.no_grad():
            model(ids[None], positions=None, cache=cache)
        return [torch.stack(cache.read(layer))[:, 0].transpose(1, 2) for layer in range(cfg.n_layers)]

    assert m.allocate("first", first) == 0
    first_table, first_kv = m.block_table("first"), prefill_kv(first)
    for layer, kv in enumerate(first_kv):                           # kv: [2, T, Hkv, D]
        pools[layer][:, m.slot_mapping("first")] = kv
    m.free("first")                                                 # its full blocks stay cached
    cached = m.allocate("second", second)
    assert cached == 32 and m.block_table("second")[:2] == first_table[:2]
    fresh = prefill_kv(second)
    slots = m.slot_mapping("second", 0, cached)
    for layer in range(cfg.n_layers):
        torch.testing.assert_close(pools[layer][:, slots], fresh[layer][:, :cached], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(fresh[layer][:, cached:40], first_kv[layer][:, cached:40])


class PagingMachine(RuleBasedStateMachine):
    """Random allocate/append/fork/free with a model pool: each slot holds the token prefix whose
    K/V it would store, so any wrong share, missed copy or overlap shows as a wrong slot content."""
    BASES = ([1, 2, 1, 2, 1, 2, 1, 2, 1], [3, 3, 3, 3, 1, 1, 1, 1, 1])

    def __init__(self):
        super().__init__()
        self.m = BlockManager(num_blocks=10, block_size=3)
        self.tokens: dict[int, list[int]] = {}
        self.pool: dict[int, tuple[int, ...]] = {}
        self.next_id = 0

    def write(self, seq, start):
        for p in range(start, len(self.tokens[seq])):
            self.pool[self.m.slot(seq, p)] = tuple(self.tokens[seq][:p + 1])

    @rule(base=st.sampled_from(BASES), keep=st.integers(0, 9), suffix=st.lists(st.integers(0, 3), max_size=4))
    def allocate(self, base, keep, suffix):
        prompt, seq = base[:keep] + suffix, self.next_id
        if not prompt:
            return
        before = snapshot(self.m)
        try:
            cached = self.m.allocate(seq, prompt)
        except OutOfBlocks:
            assert snapshot(self.m) == before
            return
        self.next_id += 1
        self.tokens[seq] = list(prompt)
        assert cached % self.m.block_size == 0 and cached < len(prompt)
        table = self.m.block_table(seq)
        for p in range(cached):                                     # a hit holds this very prefix
            assert self.pool[self.m.slot(seq, p)] == tuple(prompt[:p + 1])
        assert all(self.m.ref_count(b) == 1 for b in table[cached // self.m.block_size:])
        self.write(seq, cached)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), token=st.integers(0, 3))
    def append(self, data, token):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        before = snapshot(self.m)
        try:
            copy = self.m.append_token(seq, token)
        except OutOfBlocks:
            assert snapshot(self.m) == before
            return
        if copy is not None:
            src, dst = copy
            for offset in range(len(self.tokens[seq]) % self.m.block_size):
                self.pool[dst * self.m.block_size + offset] = self.pool[src * self.m.block_size + offset]
        self.tokens[seq].append(token)
        assert self.m.ref_count(self.m.block_table(seq)[-1]) == 1    # the writer owns its tail alone
        self.write(seq, len(self.tokens[seq]) - 1)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.fork(parent, self.next_id)
        self.tokens[self.next_id] = list(self.tokens[parent])
        self.next_id += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.free(seq)
        del self.tokens[seq]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def truncate(self, data):
        """Drop a tail (rejected drafts); later appends must overwrite it without touching others."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        keep = data.draw(st.integers(1, len(self.tokens[seq])))
        self.m.truncate(seq, keep)
        del self.tokens[seq][keep:]

    @rule()
    def free_everything(self):
        for seq in list(self.tokens):
            self.m.free(seq)
        self.tokens.clear()
        assert self.m.num_free_blocks == self.m.num_blocks
        assert len(self.m.free_block_ids) + self.m.cache.num_idle == self.m.num_blocks

    @invariant()
    def every_block_is_exactly_one_of_free_idle_or_referenced(self):
        free, idle = self.m.free_block_ids, self.m.cache.idle_blocks()
        referenced = [b for b in range(self.m.num_blocks) if self.m.ref_count(b) > 0]
        assert sorted(free + idle + referenced) == list(range(self.m.num_blocks))

    @invariant()
    def refcounts_equal_the_tables_holding_each_block(self):
        tables = [self.m.block_table(s) for s in self.tokens]
        for b in range(self.m.num_blocks):
            assert self.m.ref_count(b) == sum(t.count(b) for t in tables)

    @invariant()
    def every_slot_holds_its_own_prefix(self):
        """Shared slots are only those of identical prefixes; copy-on-write kept writers apart."""
        for seq, tokens in self.tokens.items():
            assert self.m.num_tokens(seq) == len(tokens)
            slots = self.m.slot_mapping(seq)
            assert len(set(slots)) == len(slots)
            for p, slot in enumerate(slots):
                assert self.pool[slot] == tuple(tokens[:p + 1])

    @invariant()
    def the_cache_names_blocks_holding_that_prefix(self):
        free = set(self.m.free_block_ids)
        for tokens in self.tokens.values():
            for i, h in enumerate(full_block_hashes(tokens, self.m.block_size)):
                block = self.m.cache.lookup(h)
                if block is not None:
                    assert block not in free
                    end = (i + 1) * self.m.block_size
                    assert self.pool[block * self.m.block_size + self.m.block_size - 1] == tuple(tokens[:end])


    @invariant()
    def every_cached_block_holds_the_prefix_its_hash_names(self):
        """No stale entry: a truncated, rewritten block must have left the cache."""
        for block_hash, block in list(self.m.cache._block_of.items()):
            prefix = self.pool[block * self.m.block_size + self.m.block_size - 1]
            assert full_block_hashes(list(prefix), self.m.block_size)[-1] == block_hash


TestPagingMachine = PagingMachine.TestCase
TestPagingMachine.settings = settings(max_examples=100, stateful_step_count=40, derandomize=True,
                                      database=None, deadline=None)
