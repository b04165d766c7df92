"""Known-wrong and cheating submissions for chapter 01 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py).
None of them may earn the exercise's full points. Sections of the same kind are graded in
batches: the k-th "wrong" section of every exercise goes into one notebook, and likewise for
"cheat".
"""

# %% grade_id: naive_work | wrong: counts each step after appending the new token
# expect: one position too long
# replace:
#         seq_len = prompt_len + step
# with:
#         seq_len = prompt_len + step + 1


# %% grade_id: naive_work | wrong: counts only the causal half of the score matrix
# expect: causal half
# replace:
#         cells += seq_len * seq_len
# with:
#         cells += seq_len * (seq_len + 1) // 2


# %% grade_id: naive_work | cheat: imports the reference implementation
# expect: is not allowed
from reference.decoding import naive_work  # noqa: F401


# %% grade_id: naive_work | cheat: hard-codes the 100-token example
# expect: Step i runs the model over L = P + i
def naive_work(prompt_len, n_new):
    if n_new == 0:
        return 0, 0
    return 5050, 338350


# %% grade_id: causal_attention | wrong: forgets the 1/sqrt(D) scale
# expect: not divided by sqrt(D)
# replace:
#     scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dim)
# with:
#     scores = torch.matmul(q, k.transpose(-2, -1))


# %% grade_id: causal_attention | wrong: masks the diagonal too
# expect: must still see itself
# replace:
#     future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=q.device).triu(diagonal=1)
# with:
#     future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=q.device).triu(diagonal=0)


# %% grade_id: causal_attention | wrong: softmax over the query axis
# expect: over the query axis
# replace:
#     weights = torch.softmax(scores, dim=-1)
# with:
#     weights = torch.softmax(scores, dim=-2)


# %% grade_id: causal_attention | wrong: no causal mask
# expect: there is no causal mask
# replace:
#     future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=q.device).triu(diagonal=1)
#     scores = scores.masked_fill(future, float("-inf"))
# with:


# %% grade_id: causal_attention | cheat: calls the fused kernel the exercise forbids
# expect: which this exercise forbids
def causal_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# %% grade_id: causal_attention | cheat: the fused math kernel of torch.ops.aten, fetched by a built name
# expect: may not reach torch's internals
# expect score: 0
def causal_attention(q, k, v):
    fused = getattr(torch.ops.aten, "_scaled_dot_" + "product_attention_math")
    return fused(q, k, v, is_causal=True)[0]


# %% grade_id: causal_attention | cheat: torch.ao.quantization.prepare swaps a TransformerEncoderLayer's attention for the quantizable one, whose Python attention (bmm, softmax) does the work; no attention module named
# expect: `torch.ao.nn.quantizable.MultiheadAttention._forward_impl` is forbidden
# expect score: 0
def causal_attention(q, k, v):
    T, D = q.shape[-2:]
    dt = q.dtype
    layer = torch.nn.TransformerEncoderLayer(D, 1, D, dropout=0.0).to(dt).train(False)
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(torch.eye(D, dtype=dt).repeat(3, 1))
        layer.self_attn.in_proj_bias.zero_()
        layer.self_attn.out_proj.weight.copy_(torch.eye(D, dtype=dt))
        layer.self_attn.out_proj.bias.zero_()
    observer = torch.ao.quantization.NoopObserver
    layer.qconfig = torch.ao.quantization.QConfig(activation=observer, weight=observer)
    torch.ao.quantization.prepare(layer, inplace=True)      # self_attn is the quantizable one now
    fold = lambda t: t.reshape(-1, T, D).transpose(0, 1)      # noqa: E731 - [T, batch, D]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    with torch.no_grad():
        out, _ = layer.self_attn(fold(q), fold(k), fold(v), attn_mask=future, need_weights=False)
    return out.transpose(0, 1).reshape(q.shape)


# %% grade_id: causal_attention | cheat: returns a tensor of the right shape
# expect: is not close to the expected values
def causal_attention(q, k, v):
    return torch.zeros_like(q)


# %% grade_id: naive_generate | wrong: feeds only the newest token without a cache
# expect: only the newest token was fed
# replace:
#         for _ in range(n_new):
#             logits = model(torch.tensor([seq], dtype=torch.long))
# with:
#         for step in range(n_new):
#             logits = model(torch.tensor([seq if step == 0 else seq[-1:]], dtype=torch.long))


# %% grade_id: naive_generate | wrong: never appends the new token to the sequence
# expect: Each new token must be appended
# expect: the new token is never appended to the sequence
# replace:
#             generated.append(token)
#             seq.append(token)
# with:
#             generated.append(token)


# %% grade_id: naive_generate | wrong: returns the prompt together with the new tokens
# expect: return only the n_new generated ids
# replace:
#     return generated
# with:
#     return seq


# %% grade_id: naive_generate | cheat: calls the reference generator with its KV cache
# expect: is not allowed
from reference.decoding import generate as _ref_generate


def naive_generate(model, prompt_ids, n_new):
    return _ref_generate(model, list(prompt_ids), n_new, use_cache=True)


# %% grade_id: naive_generate | cheat: uses a cache of its own to go faster
# expect: the model was given a KV cache
# expect: no KV cache in the naive loop
# expect score: 0
def naive_generate(model, prompt_ids, n_new):
    cache = model.new_cache(batch=1)
    tok = int(model(torch.tensor([list(prompt_ids)]), cache=cache)[0, -1].argmax())
    out = [tok]
    while len(out) < n_new:
        tok = int(model(torch.tensor([[tok]]), cache=cache)[0, -1].argmax())
        out.append(tok)
    return out[:n_new]
