"""Tree verification under sampling (reference.tree_verify): a chain is the linear rule; the
tokens a tree emits follow the target (the first two on a toy bigram tree, the first on SmolLM2),
by the chi-square and total-variation test of test_speculative; the naive rule (every sibling
tested against the same p) fails the same test."""
import math

import pytest
import torch

from reference.decoding import filtered_probs
from reference.speculative import accept_drafts
from reference.toy_lm import random_table
from reference.tree_verify import accept_tree, check_tree
from test_speculative import chi_square_p_value, one_thread, story_first_token  # noqa: F401 (fixture)


def naive_accept_tree(p, tokens, parents, q, generator):
    """The tempting rule: every sibling tested against the node's own p with min(1, p/q), the
    first accepted one kept; when all are rejected, one draw from norm(max(0, p - q))."""
    children, row, path = check_tree(tokens, parents), 0, []
    while True:
        for child in children[row]:
            u = torch.rand((), generator=generator, dtype=torch.float64).item()
            if u * q[child, tokens[child]].item() < p[row, tokens[child]].item():
                path.append(child)
                row = child + 1
                break
        else:
            last = p[row] if not children[row] else (p[row] - q[children[row][-1]]).clamp_min(0)
            return [tokens[i] for i in path] + [int(torch.multinomial(last, 1, generator=generator))], path


def tv(counts, probs):
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


# ---------------------------------------------------------------- structure

def test_a_chain_is_the_linear_rule_draw_for_draw():
    """parents [-1, 0, 1]: the same random numbers as accept_drafts, hence the same tokens."""
    for seed in range(300):
        gen = torch.Generator().manual_seed(seed)
        p = torch.softmax(2 * torch.randn(4, 7, generator=gen), -1)
        q = torch.softmax(2 * torch.randn(3, 7, generator=gen), -1)
        drafts = torch.randint(0, 7, (3,), generator=gen).tolist()
        for q_ in (q, None):
            chain, tree = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            emitted, checked, accepted = accept_drafts(p, drafts, q_, chain)
            out, path = accept_tree(p, drafts, [-1, 0, 1], q_, tree)
            assert out == emitted and path == list(range(accepted))


def test_the_accepted_nodes_form_a_branch_and_one_token_follows():
    """Uniform target, top-k style candidates (q None): every branch length 0..3 occurs."""
    gen = torch.Generator().manual_seed(0)
    parents = [-1, -1, -1, 0, 0, 1, 3, 3]
    tokens = [0, 1, 2, 3, 4, 0, 1, 2]
    p = torch.full((len(parents) + 1, 5), 0.2)
    lengths = set()
    for _ in range(500):
        out, path = accept_tree(p, tokens, parents, None, gen)
        assert len(out) == len(path) + 1 and out[:-1] == [tokens[i] for i in path]
        assert [parents[i] for i in path] == ([-1] + path)[:len(path)]
        lengths.add(len(path))
    assert lengths == {0, 1, 2, 3}


def test_bad_trees_raise_one_line_errors():
    p, q = torch.full((3, 4), 0.25), torch.full((2, 4), 0.25)
    for args in [([1, 2], [-1, 1], p, q), ([1], [-1, 0], p, q), ([1, 2], [-1, 0], p[:2], q),
                 ([1, 2], [-1, 0], p, q[:1])]:
        with pytest.raises(ValueError):
            accept_tree(*args)


def test_top_k_candidates_give_a_token_from_the_tree_with_the_targets_mass_on_them():
    """Deterministic siblings (q one-hot): the node yields a child exactly when the target's own
    draw would have been one of them, with probability sum_j p(c_j) (one child: p(c_1))."""
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(1, 8, generator=gen).double(), -1)
    p = torch.cat([p, torch.full((3, 8), 1 / 8, dtype=torch.float64)])
    tokens, n = p[0].topk(3).indices.tolist(), 20_000
    hits = sum(bool(accept_tree(p, tokens, [-1, -1, -1], None, gen)[1]) for _ in range(n))
    mass = p[0, tokens].sum().item()
    assert abs(hits / n - mass) < 4 * math.sqrt(mass * (1 - mass) / n)


# ---------------------------------------------------------------- exactness, toy tree

def toy_round(last, P, Q, gen, widths, iid):
    """A draft tree below `last` (widths per level, i.i.d. draws from Q or Q's top candidates)
    and the rows accept_tree needs from bigram tables P (target) and Q (draft)."""
    tokens, parents, q_rows, frontier = [], [], [], [(-1, last)]
    for width in widths:
        level = []
        for parent, token in frontier:
            row = Q[token]
            xs = (torch.multinomial(row, width, replacement=True, generator=gen).tolist() if iid
                  else row.topk(width).indices.tolist())
            for x in xs:
                tokens.append(x)
                parents.append(parent)
                q_rows.append(row)
                level.append((len(tokens) - 1, x))
        frontier = level
    p = torch.stack([P[last]] + [P[t] for t in tokens])
    return tokens, parents, p, (torch.stack(q_rows) if iid else None)


def bigram_pair(seed, vocab=6):
    """Target and draft bigram tables [vocab, vocab] in float64, rows summing to 1."""
    gen = torch.Generator().manual_seed(seed)
    P, Q = (random_table(vocab, gen).double() for _ in range(2))
    return P / P.sum(-1, keepdim=True), Q / Q.sum(-1, keepdim=True), gen


def first_two_tokens(rule, P, Q, gen, n, widths=(3, 2), iid=True):
    """Counts [vocab, vocab] of the first two tokens after token 0, rounds until two are out."""
    vocab = P.shape[0]
    counts = torch.zeros(vocab * vocab, dtype=torch.float64)
    for _ in range(n):
        out = []
        while len(out) < 2:
            tokens, parents, p, q = toy_round(out[-1] if out else 0, P, Q, gen, widths, iid)
            out += rule(p, tokens, parents, q, gen)[0]
        counts[out[0] * vocab + out[1]] += 1
    return counts


@pytest.mark.parametrize("iid", [True, False], ids=["iid siblings", "top-k siblings"])
def test_toy_tree_emits_the_targets_first_two_tokens(iid):
    P, Q, gen = bigram_pair(11)
    joint = (P[0][:, None] * P).flatten()
    counts = first_two_tokens(accept_tree, P, Q, gen, 10_000, iid=iid)
    assert tv(counts, joint) < 0.04           # noise over 36 cells at 10k draws: about 0.024
    assert chi_square_p_value(counts, joint) > 1e-3


def test_the_naive_sibling_rule_fails_the_same_test():
    P, Q, gen = bigram_pair(11)
    joint = (P[0][:, None] * P).flatten()
    counts = first_two_tokens(naive_accept_tree, P, Q, gen, 10_000)
    assert tv(counts, joint) > 0.1
    assert chi_square_p_value(counts, joint) < 1e-9


# ---------------------------------------------------------------- exactness, SmolLM2

def test_smollm2_first_token_from_a_tree_of_layer_skip_drafts(real_model):
    """SmolLM2 with layer-skip drafts (story_first_token), three siblings drawn from q: the exact
    rule's first tokens follow p, the naive rule's do not. The rows after the siblings only draw
    the second token, which is not counted: uniform rows stand in for them."""
    p0, q0 = story_first_token(*real_model)
    vocab, gen, n, m = p0.shape[0], torch.Generator().manual_seed(5), 10_000, 3
    rows = torch.cat([p0[None], torch.full((m, vocab), 1.0 / vocab, dtype=torch.float64)])
    counts = {rule: torch.zeros(vocab, dtype=torch.float64) for rule in (accept_tree, naive_accept_tree)}
    for rule, c in counts.items():
        for _ in range(n if rule is accept_tree else n // 3):
            tokens = torch.multinomial(q0, m, replacement=True, generator=gen).tolist()
            c[rule(rows, tokens, [-1] * m, q0.expand(m, vocab), gen)[0][0]] += 1
    assert 0.2 < sum(min(a, b) for a, b in zip(p0.tolist(), q0.tolist())) < 0.8   # a drafter worth testing
    assert tv(counts[accept_tree], p0) < 0.025     # noise over its ~10 tokens at 10k: ~0.013
    assert chi_square_p_value(counts[accept_tree], p0) > 1e-3
    assert tv(counts[naive_accept_tree], p0) > 0.1
    assert chi_square_p_value(counts[naive_accept_tree], p0) < 1e-9
