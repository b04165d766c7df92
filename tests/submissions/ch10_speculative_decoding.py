"""Known-wrong and cheating submissions for chapter 10 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: acceptance_rate | wrong: the chance that two draws agree (the token-matching rule)
# expect: token-matching rule
# replace:
#     return float(torch.minimum(p.double(), q.double()).sum())
# with:
#     return float((p.double() * q.double()).sum())


# %% grade_id: acceptance_rate | wrong: returns the total-variation distance
# expect: alpha = 1 - TV
# replace:
#     return float(torch.minimum(p.double(), q.double()).sum())
# with:
#     return float(0.5 * (p.double() - q.double()).abs().sum())


# %% grade_id: acceptance_rate | cheat: imports the reference implementation
# expect: is not allowed
from reference.speculative import acceptance_rate  # noqa: F401


# %% grade_id: expected_tokens | wrong: forgets the target's own token (the bonus)
# expect: the target's own token is missing
# replace:
#     return float(sum(alpha ** j for j in range(k + 1)))
# with:
#     return float(sum(alpha ** j for j in range(k)))


# %% grade_id: expected_tokens | wrong: the closed form without the alpha = 1 limit
# expect: ZeroDivisionError
# replace:
#     return float(sum(alpha ** j for j in range(k + 1)))
# with:
#     return (1 - alpha ** (k + 1)) / (1 - alpha)


# %% grade_id: expected_tokens | cheat: imports the reference implementation
# expect: is not allowed
import reference.speculative as rs

expected_tokens = rs.expected_tokens


# %% grade_id: accept_and_residual | wrong: accepts with p(x), the token-matching rule
# expect: token-matching rule
# replace:
#     accept = min(1.0, float(p[draft_token]) / float(q[draft_token]))
# with:
#     accept = float(p[draft_token])


# %% grade_id: accept_and_residual | wrong: resamples from p instead of the residual
# expect: resampling from p after a rejection
# replace:
#     return accept, (residual / total if total > 0 else p.clone())
# with:
#     return accept, p.clone()


# %% grade_id: accept_and_residual | wrong: divides by the residual's sum even when it is 0 (p == q)
# expect: return p itself rather than dividing
# replace:
#     return accept, (residual / total if total > 0 else p.clone())
# with:
#     return accept, residual / total


# %% grade_id: accept_and_residual | cheat: imports the reference speculative_accept module
# expect: is not allowed
from reference.speculative import speculative_accept


def accept_and_residual(p, q, draft_token):
    residual = (p - q).clamp_min(0.0)
    return min(1.0, float(p[draft_token] / q[draft_token])), residual / residual.sum()


# %% grade_id: tree_attention_mask | wrong: each node sees only its parent
# expect: grandparents too
# replace:
#             mask[i] |= mask[parent]
# with:
#             mask[i, parent] = True


# %% grade_id: tree_attention_mask | wrong: the causal mask
# expect: this is the causal mask
def tree_attention_mask(parents):
    return torch.ones(len(parents), len(parents), dtype=torch.bool).tril()


# %% grade_id: tree_attention_mask | cheat: imports the reference implementation
# expect: is not allowed
from reference.speculative import tree_attention_mask  # noqa: F401


# %% grade_id: speculative_generate | wrong: never rolls the target's cache back
# expect: A cache filled up
# replace:
#         target_cache.truncate(len(tokens) - 1)
# with:


# %% grade_id: speculative_generate | wrong: forgets the bonus token when all k drafts pass
# expect: the bonus token
# replace:
#         new = drafts[:kept] + [best[kept]]
# with:
#         new = drafts[:kept] + ([best[kept]] if kept < len(drafts) or not drafts else [])


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


# %% grade_id: speculative_generate | cheat: verifies guesses, not drafts: the draft model is never asked, the last token repeated k times is fed for the target to check (its greedy rule keeps the output right; 5/10 when only the output and the pass shapes were seen)
# expect: but the draft model proposes
# expect score: 0
# replace:
#         feed, drafts = [tokens[-1]], []
#         for _ in range(n_draft):
#             token = int(draft(torch.tensor([feed]), cache=draft_cache)[0, -1].argmax())
#             drafts.append(token)
#             feed = [token]
# with:
#         drafts = [tokens[-1]] * n_draft                  # guesses: the draft model is never asked


# %% grade_id: speculative_generate | wrong: never rolls the draft's cache back (its proposals after a rejection come from a context holding the rejected drafts; the target still makes the output right, so only the drafts show it)
# expect: cut the draft's cache back to the kept tokens too
# replace:
#         draft_cache.truncate(min(draft_cache.length, len(tokens) - 1))
#         if draft_cache.length < len(tokens) - 1:  # all drafts kept: the last one was never fed
#             draft(torch.tensor([tokens[draft_cache.length:-1]]), cache=draft_cache)
# with:
#         if draft_cache.length < len(tokens) - 1:  # all drafts kept: the last one was never fed
#             draft(torch.tensor([tokens[draft_cache.length:-1]]), cache=draft_cache)


# %% grade_id: speculative_generate | cheat: verifies the drafts one target pass at a time: [last, d_1] in one pass, then each further draft in a pass of its own, fed only once its verdict (from the pass before) accepts it (output and rollbacks right; 10/10 on the first test when only the drafts' source, the cache lengths and "some pass feeds more than one position" were seen)
# expect score: 0
# expect: in ONE pass
# replace:
#         best = target(torch.tensor([tokens[-1:] + drafts]), cache=target_cache)[0].argmax(-1).tolist()
# with:
#         best = target(torch.tensor([tokens[-1:] + drafts[:1]]), cache=target_cache)[0].argmax(-1).tolist()
#         fed = 1                          # drafts fed so far; the next one only once it is accepted
#         while fed < len(drafts) and drafts[fed - 1] == best[fed - 1] and drafts[fed] == best[fed]:
#             best += target(torch.tensor([[drafts[fed]]]), cache=target_cache)[0].argmax(-1).tolist()
#             fed += 1


# %% grade_id: speculative_generate | wrong: never cuts the draft's cache back: the draft re-reads the whole sequence into a new cache of its own every round (its proposals are right, so only the draft model's forwards show it)
# expect score: 0
# expect: cut the draft's cache back to the kept tokens
# replace:
#         feed, drafts = [tokens[-1]], []
# with:
#         draft_cache = draft.new_cache(batch=1, max_len=len(tokens) + k + 1)
#         feed, drafts = list(tokens), []
# replace:
#         draft_cache.truncate(min(draft_cache.length, len(tokens) - 1))
#         if draft_cache.length < len(tokens) - 1:  # all drafts kept: the last one was never fed
#             draft(torch.tensor([tokens[draft_cache.length:-1]]), cache=draft_cache)
# with:
