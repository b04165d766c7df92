"""Known-wrong and cheating submissions for chapter 06 (see tests/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: online_softmax | wrong: no max subtraction (exp of the raw scores)
# expect: subtract the (running) max
# replace:
#         l = l * torch.exp(m - safe) + torch.exp(block - safe[..., None]).sum(dim=-1)
#         m = m_new
#     return torch.exp(scores - m[..., None]) / l[..., None], m, l
# with:
#         l = l + torch.exp(block).sum(dim=-1)                  # no max subtracted
#         m = m_new
#     return torch.exp(scores) / l[..., None], m, l * torch.exp(-m)


# %% grade_id: online_softmax | wrong: does not rescale l when the max grows
# expect: was not rescaled when the max grew
# replace:
#         l = l * torch.exp(m - safe) + torch.exp(block - safe[..., None]).sum(dim=-1)
# with:
#         l = l + torch.exp(block - safe[..., None]).sum(dim=-1)


# %% grade_id: online_softmax | wrong: no guard for a tile that is all -inf
# expect: exp(-inf - (-inf)) is NaN
# replace:
#         safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # all -inf so far
# with:
#         safe = m_new


# %% grade_id: online_softmax | cheat: torch.softmax through getattr, m and l from the row
# expect: is forbidden
def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError("tile < 1")
    m = scores.amax(-1)
    return getattr(torch, "soft" + "max")(scores, -1), m, torch.exp(scores - m[..., None]).sum(-1)


# %% grade_id: online_softmax | cheat: imports the reference implementation
# expect: is not allowed
from reference.kernels.torch_reference import online_softmax as _reference


def online_softmax(scores, tile):
    m = scores.amax(-1)
    return _reference(scores, tile), m, torch.exp(scores - m[..., None]).sum(-1)


# %% grade_id: merge_softmax_states | wrong: adds the states without rescaling them
# expect: measured from different maxima
# replace:
#     safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)   # both empty: -inf - -inf
#     w1, w2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
#     return m, w1 * l1 + w2 * l2, w1[..., None] * o1 + w2[..., None] * o2
# with:
#     return m, l1 + l2, o1 + o2


# %% grade_id: merge_softmax_states | wrong: no guard when both states are empty
# expect: use 0 instead of -inf - (-inf)
# replace:
#     safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)   # both empty: -inf - -inf
#     w1, w2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
# with:
#     w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)


# %% grade_id: merge_softmax_states | wrong: returns o normalised by l
# expect: o stays UNnormalised
# replace:
#     return m, w1 * l1 + w2 * l2, w1[..., None] * o1 + w2[..., None] * o2
# with:
#     l = w1 * l1 + w2 * l2
#     return m, l, (w1[..., None] * o1 + w2[..., None] * o2) / l[..., None]


# %% grade_id: merge_softmax_states | cheat: imports the reference merge
# expect: is not allowed
from reference.kernels.torch_reference import merge_softmax_states as _reference


def merge_softmax_states(m1, l1, o1, m2, l2, o2):
    return _reference((m1, l1, o1), (m2, l2, o2))


# %% grade_id: softmax_kernel | wrong: no max subtraction
# expect: subtract the (running) max
# replace:
#     p = tl.exp(x - tl.max(x, axis=0))
# with:
#     p = tl.exp(x)


# %% grade_id: softmax_kernel | wrong: masks the tail with 0 instead of -inf
# expect: were loaded as 0
# replace:
#     x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
# with:
#     x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)


# %% grade_id: softmax_kernel | wrong: a Python loop over the elements of the row
# expect: no Python loops over elements
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    """Scalar loads one element at a time (right numbers, not a GPU kernel)."""
    row = tl.program_id(0)
    m = float("-inf")
    for i in range(n_cols):
        m = tl.maximum(m, tl.load(x_ptr + row * x_row_stride + i).to(tl.float32))
    total = 0.0
    for i in range(n_cols):
        total += tl.exp(tl.load(x_ptr + row * x_row_stride + i).to(tl.float32) - m)
    for i in range(n_cols):
        p = tl.exp(tl.load(x_ptr + row * x_row_stride + i).to(tl.float32) - m) / total
        tl.store(out_ptr + row * out_row_stride + i, p.to(out_ptr.dtype.element_ty))


# %% grade_id: softmax_kernel | cheat: an object named JITFunction that computes on the host
# expect: one function `softmax_kernel` decorated with @triton.jit
class JITFunction:
    """Passes a check on the type's name; the launch computes the softmax with torch on the host."""

    def __getitem__(self, grid):
        def run(x, out, n_cols, x_row_stride, out_row_stride, BLOCK):
            rows = x[:, :n_cols].double()
            p = torch.exp(rows - rows.amax(-1, keepdim=True))
            out[:, :n_cols] = (p / p.sum(-1, keepdim=True)).to(out.dtype)
        return run


softmax_kernel = JITFunction()


# %% grade_id: softmax_kernel | cheat: no import, no loop: the body reaches inspect through the namespace's F.torch, walks the stack to the launcher's tensors and answers with torch
# expect: A kernel cell is Triton code
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    frames = F.torch._jit_internal.inspect.stack()
    values = sum(map(lambda info: list(info.frame.f_locals.values()), frames), [])
    found = list(filter(lambda v: isinstance(v, (list, tuple)) and len(v) == 5
                        and isinstance(v[0], F.torch.Tensor) and isinstance(v[1], F.torch.Tensor), values))
    x, n = found[0][0], found[0][2]
    rows = x[:, :n].double()
    p = F.torch.exp(rows - rows.amax(-1, keepdim=True))
    list(map(lambda args: args[1][:, :n].copy_((p / p.sum(-1, keepdim=True)).to(args[1].dtype)), found))


# %% grade_id: softmax_kernel | cheat: calls the reference kernel from its own
# expect: is not allowed
import triton
import triton.language as tl
from reference.kernels.softmax import _softmax_kernel


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    """Inlines the course's kernel (single-block path)."""
    _softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK, True)
