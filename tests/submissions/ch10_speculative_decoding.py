"""Known-wrong and cheating submissions for chapter 10 (see tests/test_selfcheck.py).

Each section is the body of one solution cell; none may earn the exercise's full points.
"""

# %% grade_id: acceptance_rate | wrong: the chance that two draws agree (the token-matching rule)
# expect: token-matching rule
def acceptance_rate(p, q):
    return float((p * q).sum())


# %% grade_id: acceptance_rate | wrong: returns the total-variation distance
# expect: alpha = 1 - TV
def acceptance_rate(p, q):
    return float(0.5 * (p - q).abs().sum())


# %% grade_id: acceptance_rate | cheat: imports the reference implementation
# expect: is not allowed
from reference.speculative import acceptance_rate  # noqa: F401


# %% grade_id: expected_tokens | wrong: forgets the target's own token (the bonus)
# expect: the target's own token is missing
def expected_tokens(alpha, k):
    return float(sum(alpha ** j for j in range(k)) + 0.0 * alpha)


# %% grade_id: expected_tokens | wrong: the closed form without the alpha = 1 limit
# expect: ZeroDivisionError
def expected_tokens(alpha, k):
    return (1 - alpha ** (k + 1)) / (1 - alpha)


# %% grade_id: expected_tokens | cheat: imports the reference implementation
# expect: is not allowed
import reference.speculative as rs

expected_tokens = rs.expected_tokens


# %% grade_id: accept_and_residual | wrong: accepts with p(x), the token-matching rule
# expect: token-matching rule
def accept_and_residual(p, q, draft_token):
    residual = (p - q).clamp_min(0.0)
    return float(p[draft_token]), residual / residual.sum()


# %% grade_id: accept_and_residual | wrong: resamples from p instead of the residual
# expect: resampling from p after a rejection
def accept_and_residual(p, q, draft_token):
    return min(1.0, float(p[draft_token] / q[draft_token])), p.clone()


# %% grade_id: accept_and_residual | wrong: divides by the residual's sum even when it is 0 (p == q)
# expect: return p itself rather than dividing
def accept_and_residual(p, q, draft_token):
    residual = (p - q).clamp_min(0.0)
    return min(1.0, float(p[draft_token]) / float(q[draft_token])), residual / residual.sum()


# %% grade_id: accept_and_residual | cheat: imports the reference speculative_accept module
# expect: is not allowed
from reference.speculative import speculative_accept


def accept_and_residual(p, q, draft_token):
    residual = (p - q).clamp_min(0.0)
    return min(1.0, float(p[draft_token] / q[draft_token])), residual / residual.sum()


# %% grade_id: tree_attention_mask | wrong: each node sees only its parent
# expect: grandparents too
def tree_attention_mask(parents):
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i, parent] = True
    return mask


# %% grade_id: tree_attention_mask | wrong: the causal mask
# expect: this is the causal mask
def tree_attention_mask(parents):
    return torch.ones(len(parents), len(parents), dtype=torch.bool).tril()


# %% grade_id: tree_attention_mask | cheat: imports the reference implementation
# expect: is not allowed
from reference.speculative import tree_attention_mask  # noqa: F401


# %% grade_id: speculative_generate | wrong: never rolls the target's cache back
# expect: The target's cache filled up
def speculative_generate(target, draft, prompt_ids, n_new, k, target_cache, draft_cache):
    tokens, out = list(prompt_ids), []
    if len(tokens) > 1:
        target(torch.tensor([tokens[:-1]]), cache=target_cache)
        draft(torch.tensor([tokens[:-1]]), cache=draft_cache)
    while len(out) < n_new:
        n_draft = min(k, n_new - len(out) - 1)
        feed, drafts = [tokens[-1]], []
        for _ in range(n_draft):
            token = int(draft(torch.tensor([feed]), cache=draft_cache)[0, -1].argmax())
            drafts.append(token)
            feed = [token]
        best = target(torch.tensor([tokens[-1:] + drafts]), cache=target_cache)[0].argmax(-1).tolist()
        kept = 0
        while kept < len(drafts) and drafts[kept] == best[kept]:
            kept += 1
        new = drafts[:kept] + [best[kept]]
        tokens += new
        out += new
        draft_cache.truncate(min(draft_cache.length, len(tokens) - 1))
        if draft_cache.length < len(tokens) - 1:
            draft(torch.tensor([tokens[draft_cache.length:-1]]), cache=draft_cache)
    return out[:n_new]


# %% grade_id: speculative_generate | wrong: forgets the bonus token when all k drafts pass
# expect: the bonus token
def speculative_generate(target, draft, prompt_ids, n_new, k, target_cache, draft_cache):
    tokens, out = list(prompt_ids), []
    if len(tokens) > 1:
        target(torch.tensor([tokens[:-1]]), cache=target_cache)
        draft(torch.tensor([tokens[:-1]]), cache=draft_cache)
    while len(out) < n_new:
        n_draft = min(k, n_new - len(out) - 1)
        feed, drafts = [tokens[-1]], []
        for _ in range(n_draft):
            token = int(draft(torch.tensor([feed]), cache=draft_cache)[0, -1].argmax())
            drafts.append(token)
            feed = [token]
        best = target(torch.tensor([tokens[-1:] + drafts]), cache=target_cache)[0].argmax(-1).tolist()
        kept = 0
        while kept < len(drafts) and drafts[kept] == best[kept]:
            kept += 1
        new = drafts[:kept] + ([best[kept]] if kept < len(drafts) or not drafts else [])
        tokens += new
        out += new
        target_cache.truncate(len(tokens) - 1)
        draft_cache.truncate(min(draft_cache.length, len(tokens) - 1))
        if draft_cache.length < len(tokens) - 1:
            draft(torch.tensor([tokens[draft_cache.length:-1]]), cache=draft_cache)
    return out[:n_new]


# %% grade_id: speculative_generate | cheat: plain greedy decoding, no speculation at all
# expect: passes suffice
def speculative_generate(target, draft, prompt_ids, n_new, k, target_cache, draft_cache):
    logits = target(torch.tensor([list(prompt_ids)]), cache=target_cache)
    out = [int(logits[0, -1].argmax())]
    while len(out) < n_new:
        out.append(int(target(torch.tensor([[out[-1]]]), cache=target_cache)[0, -1].argmax()))
    return out


# %% grade_id: speculative_generate | cheat: plain greedy decoding into a cache of its own (target.new_cache), no drafts
# expect: no target pass verified drafts
def speculative_generate(target, draft, prompt_ids, n_new, k, target_cache, draft_cache):
    cache = target.new_cache(batch=1, max_len=len(prompt_ids) + n_new)
    logits = target(torch.tensor([list(prompt_ids)]), cache=cache)
    out = [int(logits[0, -1].argmax())]
    while len(out) < n_new:
        out.append(int(target(torch.tensor([[out[-1]]]), cache=cache)[0, -1].argmax()))
    return out


# %% grade_id: speculative_generate | cheat: calls the reference generate
# expect: is not allowed
from reference.decoding import generate as _plain


def speculative_generate(target, draft, prompt_ids, n_new, k, target_cache, draft_cache):
    return _plain(target, prompt_ids, n_new)
