"""The serving engine: greedy outputs equal single-sequence decoding whatever the batch, chunk,
block and pool sizes and prefix-cache state; seeded sampling per request; bad requests rejected
alone; nothing leaks."""
import random

import pytest
import torch

from reference.decoding import generate
from reference.engine import LLM, SamplingParams
from reference.kernels.checks import INTERPRETED
from reference.model import build_tiny
from reference.tokenizer import ByteTokenizer
from devices import DEVICES

MAX_TOKENS = 20


@pytest.fixture(scope="module", params=DEVICES)
def tiny(request):
    """The tiny model on each device present: on a GPU every engine test also runs on CUDA."""
    return build_tiny(0).to(request.param), ByteTokenizer()


@pytest.fixture(scope="module")
def prompts():
    """Ten prompts sharing a 25-byte system prefix, of ragged lengths (26 to 55 tokens)."""
    rng = random.Random(0)
    system = "system: you are helpful. "
    return [system + "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 30))) for _ in range(10)]


@pytest.fixture(scope="module")
def expected(prompts):
    """What single-sequence decoding on the CPU returns: the engine must match it on any device."""
    model, tok = build_tiny(0), ByteTokenizer()
    return [generate(model, tok.encode(p), MAX_TOKENS) for p in prompts]


def run(tiny, prompts, params=None, **knobs):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, **knobs)
    return llm, llm.generate(prompts, params or SamplingParams(max_tokens=MAX_TOKENS))


# (block_size, num_blocks, max_num_seqs, max_num_batched_tokens, scheduling, prefix caching):
# every pool holds the longest request (55 + 20 tokens); the small ones force preemption.
CONFIGS = {
    "roomy pool, small chunks": (4, 400, 4, 16, "continuous", True),
    "preempting, 4-token blocks": (4, 22, 8, 8, "continuous", True),
    "preempting, no prefix cache": (16, 6, 8, 32, "continuous", False),
    "one-token blocks": (1, 85, 10, 10, "continuous", True),
    "static, preempting": (8, 11, 5, 64, "static", False),
    "static, 6-token budget": (2, 400, 3, 6, "static", True),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_greedy_outputs_equal_single_sequence_decoding(tiny, prompts, expected, config):
    block_size, num_blocks, seqs, budget, scheduling, caching = config
    llm, outs = run(tiny, prompts, block_size=block_size, num_blocks=num_blocks, max_num_seqs=seqs,
                    max_num_batched_tokens=budget, scheduling=scheduling, enable_prefix_caching=caching)
    for i, (out, want) in enumerate(zip(outs, expected)):
        assert out.token_ids == want, f"request {i} differs from reference.decoding.generate under {config}"
        assert out.finish_reason == "length" and out.finished
    stats = llm.engine.stats
    if num_blocks * block_size < 200:
        assert stats["preemptions"] > 0, "this pool was sized to force preemption; none happened"
    assert llm.engine.blocks.num_free_blocks == num_blocks, "blocks leaked after every request finished"


def test_warm_prefix_cache_reuses_blocks_and_keeps_outputs(tiny, prompts, expected):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, block_size=4, num_blocks=400, max_num_seqs=4, max_num_batched_tokens=64)
    llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    hits_before = llm.engine.blocks.prefix_hits
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == expected
    # Second pass: every full prompt block except possibly the last is already cached.
    assert llm.engine.blocks.prefix_hits - hits_before >= sum(len(p) // 4 - 1 for p in prompts)
    assert all(o.num_cached_tokens > 0 for o in outs)


def test_one_model_call_per_step_mixes_prefill_chunks_with_decodes(tiny, prompts):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, block_size=4, num_blocks=400, max_num_seqs=4, max_num_batched_tokens=16)
    calls, batches = [], []
    served = llm.engine.runner.model          # the model as the engine runs it (its backend)
    llm.engine.runner.model = lambda ids, **kw: (calls.append(ids.shape), served(ids, **kw))[1]
    original = llm.engine.runner.run
    llm.engine.runner.run = lambda batch, blocks: (batches.append([n for _, n in batch]), original(batch, blocks))[1]
    llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert len(calls) == llm.engine.stats["steps"] == len(batches)
    assert max(len(b) for b in batches) == 4, "the batch never filled its four slots"
    assert any(1 in b and any(n > 1 for n in b) for b in batches), "no step mixed a prompt chunk with decodes"
    assert all(sum(b) <= 16 for b in batches), "a step exceeded max_num_batched_tokens"


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny, prompts):
    model, tok = tiny
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=MAX_TOKENS, seed=1234)
    alone = generate(model, tok.encode(prompts[3]), MAX_TOKENS, temperature=1.0, top_k=50, top_p=0.9, seed=1234)
    _, outs = run(tiny, [prompts[3]], params, block_size=4, num_blocks=400)
    others = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=s) for s in range(len(prompts))]
    others[3] = params
    _, crowd = run(tiny, prompts, others, block_size=8, num_blocks=400, max_num_seqs=6, max_num_batched_tokens=24)
    assert outs[0].token_ids == alone, "a seeded request alone should sample what reference.decoding samples"
    assert crowd[3].token_ids == alone, "the same seeded request in a crowded batch sampled differently"
    assert len({tuple(o.token_ids) for o in crowd}) > 1


def test_bad_requests_are_rejected_alone(tiny, prompts, expected):
    model, tok = tiny
    window = model.config.max_seq_len
    llm = LLM(model, tokenizer=tok, block_size=4, num_blocks=100)  # pool: 400 tokens
    bad_max_tokens = SamplingParams(max_tokens=4)
    bad_max_tokens.max_tokens = 0                      # mutated after validation: caught on submission
    good = SamplingParams(max_tokens=MAX_TOKENS)
    cases = [prompts[0], "x" * window, "y" * 450, "", [1, 2, 999], prompts[1], [1.5, 2], prompts[2]]
    params = [good, good, good, good, good, bad_max_tokens, good, good]
    outs = llm.generate(cases, params)
    reasons = [o.finish_reason for o in outs]
    assert reasons == ["length", "error", "error", "error", "error", "error", "error", "length"]
    assert "context window" in outs[1].error and "pool" in outs[2].error and "empty" in outs[3].error
    assert "vocabulary" in outs[4].error and "max_tokens" in outs[5].error and "int" in outs[6].error
    assert outs[0].token_ids == expected[0] and outs[7].token_ids == expected[2]
    with pytest.raises(TypeError, match="prompts must be"):
        llm.generate(42)
    with pytest.raises(ValueError, match="sampling params for"):
        llm.generate(prompts[:3], [good, good])
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=-1)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=float("nan"))


def test_stop_strings_eos_and_metrics(tiny, prompts, expected):
    model, tok = tiny
    want = tok.decode(expected[0])
    stop = want[5:8]
    llm, outs = run(tiny, [prompts[0]], SamplingParams(max_tokens=MAX_TOKENS, stop=stop), block_size=4, num_blocks=100)
    out = outs[0]
    assert out.finish_reason == "stop" and out.text == want[:want.find(stop)]
    m = out.metrics
    assert m.arrival_time <= m.first_token_time <= m.finish_time and out.ttft >= 0 and out.tpot >= 0
    eos = expected[1][4]                               # pretend the 5th greedy token ends the text
    llm.engine.stop_ids = {eos}
    first = expected[1].index(eos)
    stopped = llm.generate(prompts[1], SamplingParams(max_tokens=MAX_TOKENS))[0]
    ignored = llm.generate(prompts[1], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == expected[1][:first]
    assert ignored.finish_reason == "length" and ignored.token_ids == expected[1]


def test_step_api_streams_and_abort_frees_blocks(tiny, prompts):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, block_size=4, num_blocks=100)
    engine = llm.engine
    a = engine.add_request(prompts[0], SamplingParams(max_tokens=MAX_TOKENS))
    b = engine.add_request(tok.encode(prompts[1]), SamplingParams(max_tokens=3))
    seen = {a: [], b: []}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.token_ids[:len(seen[out.request_id])] == seen[out.request_id], "token_ids must only grow"
            seen[out.request_id] = out.token_ids
            if out.request_id == a and len(out.token_ids) == 5:
                engine.abort(a)
    assert len(seen[b]) == 3 and len(seen[a]) == 5
    assert engine.blocks.num_free_blocks == 100
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("x", request_id="dup"), engine.add_request("y", request_id="dup")


def test_engine_on_the_real_model_matches_decoding(real_model):
    model, tok = real_model
    llm = LLM(model, tokenizer=tok, max_num_seqs=4, max_num_batched_tokens=48, num_blocks=40)
    questions = ["What is the capital of France?", "Write a haiku about the sea."]
    ids = [tok.chat_ids(q) for q in questions]
    outs = llm.generate(ids, SamplingParams(max_tokens=16))
    for q, p, out in zip(questions, ids, outs):
        assert out.token_ids == generate(model, p, 16, stop_ids=tok.stop_ids), f"engine differs on {q!r}"
        assert out.text == tok.decode(out.token_ids)


@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_attention_equals_dense_attention(block_size):
    """The torch gather backend on a shuffled pool computes what SDPA computes on contiguous K/V."""
    from reference.attention import paged_attention
    g = torch.Generator().manual_seed(block_size)
    H, Hkv, D, num_blocks = 6, 2, 8, 64
    k_cache = torch.randn(num_blocks, block_size, Hkv, D, generator=g)
    v_cache = torch.randn(num_blocks, block_size, Hkv, D, generator=g)
    context_lens, query_lens = [1, 37, 20, 9], [1, 1, 20, 4]   # two decodes, a whole prompt, a chunk
    order = torch.randperm(num_blocks, generator=g)
    tables, used = [], 0
    for n in context_lens:
        k_blocks = -(-n // block_size)
        tables.append(order[used:used + k_blocks].tolist() + [-1] * (10 - k_blocks))
        used += k_blocks
    q = torch.randn(sum(query_lens), H, D, generator=g)
    out = paged_attention(q, k_cache, v_cache, torch.tensor(tables, dtype=torch.int32),
                          torch.tensor(context_lens, dtype=torch.int32), query_lens)
    row = 0
    for table, n, t in zip(tables, context_lens, query_lens):
        k = k_cache[table[:-(-n // block_size)]].reshape(-1, Hkv, D)[:n].double()
        v = v_cache[table[:-(-n // block_size)]].reshape(-1, Hkv, D)[:n].double()
        qs = q[row:row + t].double()
        scores = torch.einsum("thd,shd->hts", qs, k.repeat_interleave(H // Hkv, dim=1)) / D ** 0.5
        visible = torch.arange(n)[None, :] <= torch.arange(n - t, n)[:, None]
        want = torch.einsum("hts,shd->thd", scores.masked_fill(~visible, float("-inf")).softmax(-1),
                            v.repeat_interleave(H // Hkv, dim=1))
        torch.testing.assert_close(out[row:row + t].double(), want, rtol=1e-4, atol=1e-5)
        row += t


def test_triton_attention_backend_serves_the_same_tokens(tiny, prompts, expected):
    """attention="triton": K/V stored by the store kernel, decode steps through the paged decode
    kernel (compiled on a GPU, interpreted without one); prompt chunks keep the gather. On a GPU
    machine the kernels are compiled for CUDA, and a model on the CPU is refused up front."""
    model, tok = tiny
    if model.device.type == "cpu" and not INTERPRETED:
        with pytest.raises(ValueError, match="need the model on a CUDA GPU, not cpu"):
            LLM(model, tokenizer=tok, attention="triton")
        return
    _, outs = run(tiny, prompts[:2], SamplingParams(max_tokens=4), block_size=8, num_blocks=40,
                  attention="triton")
    assert [o.token_ids for o in outs] == [e[:4] for e in expected[:2]]


def test_triton_attention_on_the_cpu_without_the_interpreter_is_refused_before_any_request(monkeypatch):
    """Without TRITON_INTERPRET=1 the kernels are compiled for CUDA: a CPU engine would fail at
    its first step, deep in a launch. The engine says so when it is built instead."""
    import reference.kernels.checks as checks
    monkeypatch.setattr(checks, "INTERPRETED", False)
    with pytest.raises(ValueError, match="use attention='torch' there, or set TRITON_INTERPRET=1"):
        LLM(build_tiny(0), tokenizer=ByteTokenizer(), attention="triton")
