"""Speculative decoding inside the engine: greedy outputs unchanged token for token, sampled
outputs distributed as without speculation, rejected drafts' blocks handed back."""
import random

import pytest
import torch

from reference.decoding import generate
from reference.engine import LLM, SamplingParams
from reference.model import build_tiny
from reference.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(0), ByteTokenizer()


@pytest.fixture(scope="module")
def prompts():
    """Repetitive prompts, so that prompt lookup finds n-grams to copy."""
    rng = random.Random(1)
    return ["abcabcabcabcabc" + "".join(rng.choice("abc") for _ in range(rng.randint(1, 20))) for _ in range(8)]


@pytest.mark.parametrize("method,k,knobs", [
    ("prompt_lookup", 1, dict(block_size=4, num_blocks=400)),
    ("prompt_lookup", 5, dict(block_size=4, num_blocks=24, max_num_seqs=8, max_num_batched_tokens=16)),
    ("prompt_lookup", 3, dict(block_size=1, num_blocks=100, max_num_seqs=3, max_num_batched_tokens=8,
                              scheduling="static")),
    ("layer_skip", 3, dict(block_size=4, num_blocks=400, max_num_seqs=4)),
], ids=["lookup k=1", "lookup k=5 preempting", "lookup k=3 static", "layer skip k=3"])
def test_greedy_speculative_engine_equals_plain_decoding(tiny, prompts, method, k, knobs):
    model, tok = tiny
    want = [generate(model, tok.encode(p), 30) for p in prompts]
    llm = LLM(model, tokenizer=tok, speculative=method, num_speculative_tokens=k,
              speculative_draft_layers=1, **knobs)
    outs = llm.generate(prompts, SamplingParams(max_tokens=30))
    assert [o.token_ids for o in outs] == want
    stats = llm.engine.stats
    assert stats["spec_proposed"] > 0 and stats["spec_accepted"] > 0, "no draft was proposed or accepted"
    assert stats["steps"] < sum(len(w) for w in want), "speculation should save steps"
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks, "blocks leaked"
    if knobs["num_blocks"] < 50:
        assert stats["preemptions"] > 0


class GreedyTargetDrafter:
    """Proposes the target's own greedy continuation (a deterministic drafter: one-hot q). Under
    sampling its drafts are accepted often but not always: both branches of the test run."""

    def __init__(self, model):
        self.model = model

    def reset(self, max_len):
        pass

    def propose(self, tokens, k, to_probs=None, generator=None):
        return generate(self.model, tokens, k), None


@pytest.mark.parametrize("method", ["greedy-target", "layer_skip"])
def test_sampled_speculative_engine_keeps_the_target_distribution(tiny, method):
    """600 seeded requests with and without drafts: the tokens at output positions 1 and 2
    (where drafts were tested) must have the same distribution (two-sample chi-square). One
    drafter is deterministic (one-hot q), layer skip drafts from the first layer's distribution."""
    model, tok = tiny
    if method == "greedy-target":
        method = lambda: GreedyTargetDrafter(model)  # noqa: E731
    prompt = "speculative decoding"
    n = 600
    params = [SamplingParams(temperature=1.5, top_k=4, max_tokens=3, seed=s) for s in range(n)]
    plain = LLM(model, tokenizer=tok, max_num_seqs=64, max_num_batched_tokens=256, block_size=4, num_blocks=1000)
    spec = LLM(model, tokenizer=tok, max_num_seqs=64, max_num_batched_tokens=256, block_size=4, num_blocks=1000,
               speculative=method, num_speculative_tokens=2, speculative_draft_layers=1)
    a = plain.generate([prompt] * n, params)
    b = spec.generate([prompt] * n, params)
    assert spec.engine.stats["spec_checked"] > 200 and 0 < spec.engine.stats["spec_accepted"] < spec.engine.stats["spec_checked"]
    for position in (1, 2):
        xs = [tuple(o.token_ids[:position + 1]) for o in a]
        ys = [tuple(o.token_ids[:position + 1]) for o in b]
        outcomes = sorted(set(xs) | set(ys))
        counts = torch.tensor([[xs.count(v) for v in outcomes], [ys.count(v) for v in outcomes]], dtype=torch.float64)
        keep = counts.sum(0) >= 10                        # pool rare outcomes into one cell
        table = torch.cat([counts[:, keep], counts[:, ~keep].sum(1, keepdim=True)], 1)
        table = table[:, table.sum(0) > 0]
        expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
        chi2 = float(((table - expected) ** 2 / expected).sum())
        dof = table.shape[1] - 1
        # Wilson-Hilferty: the chi-square quantile at p = 0.001 (z = 3.09) for dof degrees of freedom
        critical = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3
        assert chi2 < critical, f"prefix of {position + 1} tokens: chi2 {chi2:.1f} >= {critical:.1f} ({dof} dof)"


def test_real_model_prompt_lookup_on_an_editing_task(real_model):
    model, tok = real_model
    passage = ("The quick brown fox jumps over the lazy dog. The dog sleeps in the sun. "
               "The fox runs into the forest and the dog does not follow.")
    ids = tok.chat_ids(f"Repeat this text exactly, replacing 'fox' with 'cat':\n{passage}")
    llm = LLM(model, tokenizer=tok, num_blocks=40, speculative="prompt_lookup", num_speculative_tokens=4)
    out = llm.generate(ids, SamplingParams(max_tokens=24))[0]
    assert out.token_ids == generate(model, ids, 24, stop_ids=tok.stop_ids)
    stats = llm.engine.stats
    assert stats["spec_accepted"] > 0 and stats["steps"] < len(out.token_ids)


def test_real_model_sampled_first_tokens_follow_the_target(real_model):
    """SmolLM2, layer-skip drafts, temperature 1 and top-k 4: the first two sampled tokens of 240
    seeded requests follow the exact joint distribution p(t1) p(t2 | t1) computed from the
    target alone (chi-square goodness of fit; the second token went through the acceptance test)."""
    from reference.decoding import filtered_probs

    model, tok = real_model
    prompt = tok.chat_ids("Name a colour.")
    n, top_k = 240, 4
    llm = LLM(model, tokenizer=tok, max_num_seqs=120, max_num_batched_tokens=240, num_blocks=400,
              speculative="layer_skip", num_speculative_tokens=1, speculative_draft_layers=4)
    # max_tokens=3: the first token comes from the prefill, the second from the one draft round
    outs = llm.generate([prompt] * n, [SamplingParams(temperature=1.0, top_k=top_k, max_tokens=3, seed=s)
                                       for s in range(n)])
    assert llm.engine.stats["spec_checked"] == n, "every request should test exactly one draft"
    first = filtered_probs(model(torch.tensor([prompt]))[0, -1], 1.0, top_k)
    joint = {}
    for t1 in first.nonzero().flatten().tolist():
        second = filtered_probs(model(torch.tensor([prompt + [t1]]))[0, -1], 1.0, top_k)
        for t2 in second.nonzero().flatten().tolist():
            joint[(t1, t2)] = float(first[t1] * second[t2])
    seen = [tuple(o.token_ids[:2]) for o in outs]
    assert set(seen) <= set(joint), "a sampled pair lies outside the target's top-k support"
    cells = sorted(joint, key=joint.get, reverse=True)
    expected = torch.tensor([joint[c] * n for c in cells], dtype=torch.float64)
    observed = torch.tensor([seen.count(c) for c in cells], dtype=torch.float64)
    small = expected < 5                                   # pool the rare pairs into one cell
    expected = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    observed = torch.cat([observed[~small], observed[small].sum(0, keepdim=True)])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    critical = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3   # p = 0.001
    assert chi2 < critical, f"chi2 {chi2:.1f} >= {critical:.1f} with {dof} dof"
