"""Known-wrong and cheating submissions for chapter 01 (see tests/test_selfcheck.py).

Each section is the body of one solution cell. None of them may earn the exercise's full
points. Sections of the same kind are graded in batches: the k-th "wrong" section of every
exercise goes into one notebook, and likewise for "cheat".
"""

# %% grade_id: naive_work | wrong: counts each step after appending the new token
# expect: one position too long
def naive_work(prompt_len, n_new):
    positions = cells = 0
    for i in range(n_new):
        n = prompt_len + i + 1
        positions += n
        cells += n * n
    return positions, cells


# %% grade_id: naive_work | wrong: counts only the causal half of the score matrix
# expect: causal half
def naive_work(prompt_len, n_new):
    positions = cells = 0
    for i in range(n_new):
        n = prompt_len + i
        positions += n
        cells += n * (n + 1) // 2
    return positions, cells


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
def causal_attention(q, k, v):
    t = q.shape[-2]
    s = q @ k.transpose(-2, -1)
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return s.softmax(-1) @ v


# %% grade_id: causal_attention | wrong: masks the diagonal too
# expect: must still see itself
def causal_attention(q, k, v):
    t = q.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 0), float("-inf"))
    return s.softmax(-1) @ v


# %% grade_id: causal_attention | wrong: softmax over the query axis
# expect: over the query axis
def causal_attention(q, k, v):
    t = q.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return s.softmax(-2) @ v


# %% grade_id: causal_attention | wrong: no causal mask
# expect: there is no causal mask
def causal_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return s.softmax(-1) @ v


# %% grade_id: causal_attention | cheat: calls the fused kernel the exercise forbids
# expect: which this exercise forbids
def causal_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# %% grade_id: causal_attention | cheat: returns a tensor of the right shape
# expect: is not close to the expected values
def causal_attention(q, k, v):
    return torch.zeros_like(q)


# %% grade_id: naive_generate | wrong: feeds only the newest token without a cache
# expect: only the newest token was fed
def naive_generate(model, prompt_ids, n_new):
    seq = list(prompt_ids)
    out = []
    for i in range(n_new):
        x = seq if i == 0 else seq[-1:]
        tok = int(model(torch.tensor([x]))[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
    return out


# %% grade_id: naive_generate | wrong: returns the prompt together with the new tokens
# expect: return only the n_new generated ids
def naive_generate(model, prompt_ids, n_new):
    seq = list(prompt_ids)
    for _ in range(n_new):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq


# %% grade_id: naive_generate | cheat: calls the reference generator with its KV cache
# expect: is not allowed
from reference.decoding import generate as _ref_generate


def naive_generate(model, prompt_ids, n_new):
    return _ref_generate(model, list(prompt_ids), n_new, use_cache=True)


# %% grade_id: naive_generate | cheat: uses a cache of its own to go faster
# expect: the model was given a KV cache
def naive_generate(model, prompt_ids, n_new):
    cache = model.new_cache(batch=1)
    tok = int(model(torch.tensor([list(prompt_ids)]), cache=cache)[0, -1].argmax())
    out = [tok]
    while len(out) < n_new:
        tok = int(model(torch.tensor([[tok]]), cache=cache)[0, -1].argmax())
        out.append(tok)
    return out[:n_new]
