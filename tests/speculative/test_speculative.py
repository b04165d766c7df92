"""Speculative decoding: the formulas, the exact accept/residual step, the generation loop
(greedy equal to plain decoding for every drafter, sampled output distributed as the target,
the cache invariant), and tree attention."""
import copy
import math

import pytest
import torch
from scipy import stats as scipy_stats

from reference.decoding import filtered_probs, generate
from reference.drafters import FirstLayers, ModelDrafter, PromptLookupDrafter, layer_skip_drafter
from reference.model import build_tiny
from reference.speculative import (acceptance_rate, expected_tokens, keep_branch, speculative_accept,
                                   speculative_generate, speedup, tree_attention_mask, verify_tree)
from reference.toy_lm import BigramModel, random_table


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Toy and tiny models gain nothing from threads; on a loaded machine threads cost 10x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def chi_square_p_value(counts, probs):
    """p-value of Pearson's test that counts were drawn from probs (cells with probs 0 must be empty)."""
    assert counts[probs == 0].sum() == 0, "a token the target gives probability 0 was emitted"
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * counts.sum()  # float32 rows sum to 1 only roughly
    return scipy_stats.chisquare(counts[keep].numpy(), expected.numpy()).pvalue


# ---------------------------------------------------------------- formulas

@pytest.mark.parametrize("k", [1, 4, 5, 8])
def test_expected_tokens_is_the_mean_of_the_truncated_geometric(k):
    for alpha in [0.0, 0.3, 0.8, 0.95]:
        # tau = j + 1 when the first rejection is at draft j + 1; k + 1 when all k pass
        mean = sum(alpha**j * (1 - alpha) * (j + 1) for j in range(k)) + alpha**k * (k + 1)
        assert expected_tokens(alpha, k) == pytest.approx(mean, rel=1e-12)
        assert expected_tokens(alpha, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha), rel=1e-12)
    assert expected_tokens(1.0, k) == k + 1
    assert expected_tokens(1 - 1e-12, k) == pytest.approx(k + 1, rel=1e-9)  # no 0/0 near the limit
    assert speedup(0.8, k, 0.0) == expected_tokens(0.8, k)
    assert speedup(0.8, k, 0.1) == pytest.approx(expected_tokens(0.8, k) / (1 + 0.1 * k))


def test_formula_inputs_are_checked():
    for bad in [lambda: expected_tokens(1.2, 4), lambda: expected_tokens(0.5, -1),
                lambda: expected_tokens(0.5, 2.0), lambda: speedup(0.5, 4, -0.1),
                lambda: acceptance_rate(torch.ones(3) / 3, torch.ones(4) / 4)]:
        with pytest.raises(ValueError):
            bad()


def test_acceptance_rate_is_one_minus_total_variation():
    gen = torch.Generator().manual_seed(0)
    p, q = random_table(50, gen)[:2]
    assert acceptance_rate(p, q) == pytest.approx(1 - 0.5 * (p - q).abs().sum().item(), abs=1e-6)
    assert acceptance_rate(p, p) == pytest.approx(1.0)


def test_filtered_probs_rows_are_independent_and_normalised():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(0)) * 2
    rows = filtered_probs(logits, 0.7, top_k=6, top_p=0.9)
    for row, one in zip(rows, logits):
        torch.testing.assert_close(row, filtered_probs(one, 0.7, top_k=6, top_p=0.9))
    assert torch.allclose(rows.sum(-1), torch.ones(5)) and ((rows > 0).sum(-1) <= 6).all()
    assert torch.equal(filtered_probs(logits, 0.0).argmax(-1), logits.argmax(-1))


# ---------------------------------------------------------------- one position

def toy_pair(gen, vocab=12, temperature=0.9, top_k=8, top_p=0.95):
    """Target and draft distributions after the same temperature / top-k / top-p (zeros included)."""
    logits = torch.randn(2, vocab, generator=gen) * 1.5
    p, q = filtered_probs(logits, temperature, top_k, top_p)
    return p, q


def accept_counts(p, q, n, gen):
    """n drafts x ~ q through speculative_accept: (counts of the emitted tokens, acceptances)."""
    counts, accepted = torch.zeros_like(p, dtype=torch.float64), 0
    for x in torch.multinomial(q, n, replacement=True, generator=gen).tolist():
        ok, token = speculative_accept(p, q, x, gen)
        counts[token] += 1
        accepted += ok
    return counts, accepted


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_accept_step_emits_the_target_distribution(seed):
    """30k draws x ~ q through speculative_accept: the tokens follow p, the acceptances alpha."""
    gen = torch.Generator().manual_seed(seed)
    p, q = toy_pair(gen)
    n = 30_000
    counts, accepted = accept_counts(p, q, n, gen)
    assert 0.5 * (counts / n - p.double()).abs().sum() < 0.015   # noise over <= 8 tokens: ~0.006
    assert chi_square_p_value(counts, p.double()) > 1e-3
    alpha = acceptance_rate(p, q)
    assert abs(accepted / n - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / n)


# ---------------------------------------------------------------- the loop on toy models

def test_generated_sequence_has_the_target_transition_law():
    """A bigram target and a different bigram draft, sampled with temperature and top-k: every
    transition of a long speculative run follows the target's filtered rows (chi-square per row)."""
    gen = torch.Generator().manual_seed(2)
    vocab, settings = 5, dict(temperature=0.8, top_k=4)
    target, draft = (BigramModel(random_table(vocab, gen, 2)) for _ in range(2))
    out, st = speculative_generate(target, draft, [0], 6_000, k=3, seed=3, **settings)
    seq = torch.tensor([0] + out)
    pairs = torch.zeros(vocab, vocab, dtype=torch.float64)
    pairs.index_put_((seq[:-1], seq[1:]), torch.ones(len(out), dtype=torch.float64), accumulate=True)
    rows = filtered_probs(target.table.log(), **settings).double()
    statistic, dof = 0.0, 0
    for row_counts, row_probs in zip(pairs, rows):
        assert row_counts[row_probs == 0].sum() == 0
        keep = row_probs > 0
        expected = row_probs[keep] * row_counts.sum()
        statistic += float(((row_counts[keep] - expected) ** 2 / expected).sum())
        dof += int(keep.sum()) - 1
    assert scipy_stats.chi2.sf(statistic, dof) > 1e-3
    assert 0 < st.accepted < st.checked  # both paths ran


def test_measured_alpha_and_tokens_per_pass_match_the_formulas():
    """Context-free toys (every row the same): acceptances are independent with a known alpha."""
    gen = torch.Generator().manual_seed(4)
    vocab, k = 10, 3
    p_row, q_row = random_table(vocab, gen, concentration=2)[:2]
    target, draft = BigramModel(p_row.expand(vocab, vocab)), BigramModel(q_row.expand(vocab, vocab))
    out, st = speculative_generate(target, draft, [0], 6_000, k=k, temperature=1.0, seed=5)
    alpha = acceptance_rate(p_row, q_row)
    assert abs(st.alpha_hat - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / st.checked)
    tau = torch.tensor([j + 1.0 for j in range(k + 1)], dtype=torch.float64)
    law = torch.tensor([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k], dtype=torch.float64)
    sd = math.sqrt(float((law * (tau - expected_tokens(alpha, k)) ** 2).sum()))
    slack = k / st.target_passes  # the last round drafts fewer
    assert abs(st.tokens_per_pass - expected_tokens(alpha, k)) < 4 * sd / math.sqrt(st.target_passes) + slack
    assert st.new_tokens == len(out) == 6_000


# ---------------------------------------------------------------- greedy exactness, tiny model

def perturbed_copy(model, scale, seed):
    """The model with noise on every weight: a draft that agrees often, not always."""
    gen = torch.Generator().manual_seed(seed)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    return twin


def tiny_drafters(target):
    return {"draft model": perturbed_copy(target, 0.3, 7), "prompt lookup": PromptLookupDrafter(),
            "layer skip": layer_skip_drafter(target, 1), "the target itself": ModelDrafter(target)}


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_equals_plain_decoding_for_every_drafter(k):
    target = build_tiny(0)
    prompt = list(b"abcabcabd abcab")
    expected = generate(target, prompt, 40)
    stop_expected = generate(target, prompt, 40, stop_ids=[expected[17]])
    totals = [0, 0]
    for name, drafter in tiny_drafters(target).items():
        out, st = speculative_generate(target, drafter, prompt, 40, k=k)
        assert out == expected, name
        assert st.new_tokens == 40 and st.target_passes <= 40
        assert speculative_generate(target, drafter, prompt, 40, k=k, stop_ids=[expected[17]])[0] == stop_expected
        totals[0] += st.accepted
        totals[1] += st.checked - st.accepted
    assert min(totals) > 0  # both acceptances and rejections were exercised


class RecordingTarget:
    """Wraps a model; records, at each forward with a cache, the cached K and the fed ids."""

    def __init__(self, model):
        self.model, self.config, self.calls = model, model.config, []

    def new_cache(self, batch=1, max_len=None):
        self.cache = self.model.new_cache(batch, max_len)
        return self.cache

    def __call__(self, input_ids, cache=None):
        n = cache.length
        self.calls.append((n, input_ids[0].tolist(), cache.k[:, :, :, :n].clone()))
        return self.model(input_ids, cache=cache)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cache_invariant_holds_at_every_round(temperature):
    """Before each verification the target's cache holds exactly the keys of sequence[:-1]
    (rejected drafts rolled back) and the pass is fed the sequence's last token first."""
    model = build_tiny(0)
    target = RecordingTarget(model)
    prompt = list(b"the cat sat on the mat")
    out, st = speculative_generate(target, perturbed_copy(model, 0.3, 7), prompt, 30, k=4,
                                   temperature=temperature, seed=0)
    seq = prompt + out
    full = model.new_cache(max_len=len(seq))
    model(torch.tensor([seq]), cache=full)  # the keys every position should have
    rounds = target.calls[1:]  # after the prefill
    assert len(rounds) == st.target_passes and st.checked > st.accepted > 0
    for length, fed, keys in rounds:
        assert fed[0] == seq[length]
        assert 1 <= len(fed) <= 5  # the last token, then at most k drafts
        torch.testing.assert_close(keys, full.k[:, :, :, :length], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- drafters

def test_prompt_lookup_copies_the_latest_continuation_of_the_longest_ngram():
    drafter = PromptLookupDrafter(max_ngram=3)
    assert drafter.propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], 2)[0] == [7, 8]  # 3-gram absent, 2-gram [2, 3]
    assert drafter.propose([5, 6, 7, 8, 5, 6], 4)[0] == [7, 8, 5, 6]
    assert drafter.propose([1, 2, 3], 4)[0] == []
    with pytest.raises(ValueError):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def test_a_single_shared_token_drafts_only_unigram_drafts_tokens():
    tokens = [4, 1, 2, 3, 9, 4]                       # only the unigram [4] recurs
    assert PromptLookupDrafter().propose(tokens, 4)[0] == [1], "a one-token match is weak evidence"
    assert PromptLookupDrafter(unigram_drafts=4).propose(tokens, 4)[0] == [1, 2, 3, 9]
    assert PromptLookupDrafter(unigram_drafts=0).propose(tokens, 4)[0] == []
    assert PromptLookupDrafter().propose([7, 4, 1, 2, 3, 7, 4], 3)[0] == [1, 2, 3], "a bigram match drafts k"
    with pytest.raises(ValueError):
        PromptLookupDrafter(unigram_drafts=-1)


def test_all_layers_reproduce_the_model_and_fewer_layers_differ():
    model = build_tiny(3)
    ids = torch.tensor([list(b"hello world")])
    full = FirstLayers(model, model.config.n_layers)
    torch.testing.assert_close(full(ids, cache=full.new_cache(max_len=16)), model(ids), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(FirstLayers(model, 1)(ids), model(ids), atol=1e-2)
    with pytest.raises(ValueError):
        FirstLayers(model, 0)


def test_bad_requests_raise_one_line_errors():
    target = build_tiny(0)
    for kwargs in [dict(k=0), dict(k=2.5), dict(temperature=-1.0)]:
        with pytest.raises(ValueError):
            speculative_generate(target, PromptLookupDrafter(), [1, 2], 4, **kwargs)
    small = BigramModel(torch.full((4, 4), 0.25))
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, small, [1, 2], 4)
    with pytest.raises(TypeError):
        speculative_generate(target, object(), [1, 2], 4)
    with pytest.raises(ValueError):
        BigramModel(torch.ones(3, 4) / 4)


# ---------------------------------------------------------------- tree attention

def ancestors(parents, i):
    path = {i}
    while parents[i] >= 0:
        i = parents[i]
        path.add(i)
    return path


def test_tree_mask_lets_each_node_see_its_ancestors_only():
    parents = [-1, 0, 0, 1, 1, 2, 5, -1, 7]
    mask = tree_attention_mask(parents)
    for i in range(len(parents)):
        assert {j for j in range(len(parents)) if mask[i, j]} == ancestors(parents, i)
    assert torch.equal(tree_attention_mask([-1, 0, 1, 2]), torch.ones(4, 4, dtype=torch.bool).tril())
    for bad in ([0], [-1, 1], [-1, 3, 0], [-1, 0.5]):
        with pytest.raises(ValueError):
            tree_attention_mask(bad)


def test_one_tree_pass_equals_verifying_each_branch_alone():
    model = build_tiny(0)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 256, (7,), generator=gen).tolist()
    parents = [-1, 0, 0, 1, 1, 2, 3]
    tree_ids = torch.randint(0, 256, (len(parents),), generator=gen).tolist()
    cache = model.new_cache(max_len=32)
    model(torch.tensor([prefix]), cache=cache)
    tree_logits = verify_tree(model, cache, tree_ids, parents)
    assert cache.length == len(prefix) + len(parents)
    for leaf in range(len(parents)):
        branch = sorted(ancestors(parents, leaf))
        cache.truncate(len(prefix))
        alone = model(torch.tensor([[tree_ids[j] for j in branch]]), cache=cache)[0]
        torch.testing.assert_close(tree_logits[branch], alone, rtol=1e-4, atol=1e-4)


def test_keep_branch_gathers_the_accepted_rows_before_cutting_the_cache():
    """After verify_tree, every branch kept by keep_branch continues exactly like the branch run
    alone; cutting the cache at prefix + len(branch) without the gather does not, for a branch
    whose rows are not the first ones (1 -> 4 sits in rows prefix + 1 and prefix + 4)."""
    model = build_tiny(0)
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 256, (5,), generator=gen).tolist()
    parents = [-1, -1, 0, 0, 1, 2, 4]
    tree_ids = torch.randint(0, 256, (len(parents),), generator=gen).tolist()
    next_id = torch.randint(0, 256, (1,), generator=gen).tolist()
    verified = model.new_cache(max_len=32)
    model(torch.tensor([prefix]), cache=verified)
    verify_tree(model, verified, tree_ids, parents)
    for leaf in range(len(parents)):
        branch = sorted(ancestors(parents, leaf))
        alone = model(torch.tensor([prefix + [tree_ids[i] for i in branch] + next_id]))[0, -1]
        cache = copy.deepcopy(verified)
        assert keep_branch(cache, len(prefix), parents, branch) == len(prefix) + len(branch)
        assert cache.length == len(prefix) + len(branch)
        kept = model(torch.tensor([next_id]), cache=cache)[0, -1]
        torch.testing.assert_close(kept, alone, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"branch {branch} after keep_branch: {m}")
        if branch != list(range(len(branch))):
            cut = copy.deepcopy(verified)
            cut.truncate(len(prefix) + len(branch))
            wrong = model(torch.tensor([next_id]), cache=cut)[0, -1]
            assert (wrong - alone).abs().max() > 1e-2, \
                f"truncating alone kept nodes 0..{len(branch) - 1}, not the branch {branch}"
    for not_a_branch in ([1, 3], [2], [0, 2, 4], [7]):
        with pytest.raises(ValueError, match="not a branch"):
            keep_branch(copy.deepcopy(verified), len(prefix), parents, not_a_branch)
    with pytest.raises(ValueError, match="holds"):
        keep_branch(copy.deepcopy(verified), len(prefix) + 1, parents, [0])


# ---------------------------------------------------------------- the real model (short)

def story_first_token(model, tok):
    """(p, q) float64 for SmolLM2's first token after 'Once upon a time, there was a' at T = 1,
    top-6: the target, and the layer-skip draft of its first 28 of 30 layers (same filter). Both
    are cut to the tokens either gives mass to (zero elsewhere: a small vocabulary runs faster)."""
    ids = torch.tensor([tok.encode("Once upon a time, there was a")])
    with torch.inference_mode():
        p = filtered_probs(model(ids)[0, -1], 1.0, top_k=6).double()
        q = filtered_probs(model(ids, num_layers=28)[0, -1], 1.0, top_k=6).double()
    keep = (p > 0) | (q > 0)
    return p[keep] / p[keep].sum(), q[keep] / q[keep].sum()


def test_real_model_first_sampled_token_has_the_targets_distribution(real_model):
    """SmolLM2 with layer-skip drafts (story_first_token): 30k first tokens through the accept
    step follow p."""
    p, q = story_first_token(*real_model)
    n, gen = 30_000, torch.Generator().manual_seed(0)
    counts, accepted = accept_counts(p, q, n, gen)
    alpha = acceptance_rate(p, q)
    assert 0.2 < alpha < 0.8, "a drafter that is neither useless nor perfect"
    assert 0.5 * (counts / n - p).abs().sum() < 0.02   # noise over its ~10 tokens: ~0.007
    assert chi_square_p_value(counts, p) > 1e-3
    assert abs(accepted / n - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / n)


def test_real_model_greedy_output_is_unchanged_by_speculation(real_model):
    model, tok = real_model
    prompt = tok.chat_ids("Repeat exactly: the quick brown fox jumps over the lazy dog.")
    expected = generate(model, prompt, 10, stop_ids=tok.stop_ids)
    for drafter, k in [(PromptLookupDrafter(), 4), (layer_skip_drafter(model, 12), 2)]:
        out, st = speculative_generate(model, drafter, prompt, 10, k=k, stop_ids=tok.stop_ids)
        assert out == expected, type(drafter).__name__
        assert st.target_passes <= len(expected) + 1


def test_benchmark_rows_on_the_tiny_model():
    from types import SimpleNamespace as Args

    from reference.bench.speculative import run_task
    from reference.tokenizer import ByteTokenizer

    rows = run_task(build_tiny(0), ByteTokenizer(), "abcabcabc abcab", Args(tokens=12, k=3, skip_layers=1, repeats=1))
    assert [r["drafter"] for r in rows] == ["none (plain decoding)", "prompt lookup", "layer skip (1/2)"]
    assert all(r["same"] and r["tokens"] == 12 and r["tok_s"] > 0 for r in rows)


def test_benchmark_table_shows_how_much_of_the_passes_promise_reached_the_clock(capsys):
    from reference.bench.speculative import print_table

    row = dict(tokens=64, tok_s=38.0, same=True, draft_share=0.0)
    print_table({"grounded": [dict(row, drafter="none (plain decoding)", ratio=1.0, alpha=None, tokens_per_pass=1.0),
                              dict(row, drafter="prompt lookup", ratio=2.13, alpha=0.77, tokens_per_pass=2.42)]})
    lines = capsys.readouterr().out.splitlines()
    assert "of promise" in lines[0]
    assert " 88% " in lines[-1], "2.13x over 2.42 tokens per pass is 88% of the promise"
    assert lines[-2].count("%") == 1, "plain decoding promises nothing: only its draft-time share is a percentage"


def test_benchmark_engine_rows_on_the_tiny_model():
    from types import SimpleNamespace as Args

    from reference.bench.speculative import engine_rows
    from reference.tokenizer import ByteTokenizer

    rows = engine_rows(build_tiny(0), ByteTokenizer(), "abcabcabc abcab", Args(tokens=12, k=3), batches=(1, 3))
    assert [(r["batch"], r["drafter"]) for r in rows] == [(1, "none"), (1, "prompt_lookup"), (3, "none"), (3, "prompt_lookup")]
    assert all(r["same"] and r["tokens"] == 12 * r["batch"] for r in rows)
    assert all(r["steps"] >= 12 // (3 + 1) for r in rows) and rows[1]["steps"] <= rows[0]["steps"]
    assert rows[1]["ratio"] == rows[1]["tok_s"] / rows[0]["tok_s"] and "ratio" not in rows[0]
