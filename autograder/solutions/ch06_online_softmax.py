"""Solutions of exercises/ch06_online_softmax.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch06_online_softmax")``; never imported as a
module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: online_softmax
def online_softmax(scores: Tensor, tile: int) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax over the last dim of `scores` [..., N], reading `tile` columns at a time.

    Keep, per row, the running max m and the sum l = sum exp(s - m) of the columns read so far;
    when a tile raises the max from m_old to m_new, rescale l by exp(m_old - m_new) before adding
    the tile's terms. A final sweep writes exp(s - m) / l. Entries may be -inf (probability 0);
    every row has at least one finite entry, but a whole tile of a row may be -inf.

    Returns (probs [..., N] like scores, m [...], l [...]) with m the row max and l the sum of
    exp(s - m) over the row. torch.softmax, F.softmax and logsumexp are not allowed.
    Raises ValueError if tile < 1.
    """
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    m = torch.full(scores.shape[:-1], float("-inf"), dtype=scores.dtype)
    l = torch.zeros_like(m)
    for start in range(0, scores.shape[-1], tile):
        block = scores[..., start:start + tile]
        m_new = torch.maximum(m, block.amax(dim=-1))
        safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # all -inf so far
        l = l * torch.exp(m - safe) + torch.exp(block - safe[..., None]).sum(dim=-1)
        m = m_new
    return torch.exp(scores - m[..., None]) / l[..., None], m, l


# %% grade_id: merge_softmax_states
def merge_softmax_states(m1: Tensor, l1: Tensor, o1: Tensor,
                         m2: Tensor, l2: Tensor, o2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Merge the softmax states of the same rows over two disjoint sets of keys.

    A state of a row over a set of keys with scores s_j and values v_j is (m, l, o):
    m = max_j s_j, l = sum_j exp(s_j - m), o = sum_j exp(s_j - m) v_j (UNnormalised: the
    attention output of the row is o / l). m1, l1, m2, l2 have shape [...]; o1, o2 [..., D].
    A state over no keys is (-inf, 0, 0) and must change nothing; two empty states merge into
    (-inf, 0, 0) without NaN. Returns the state (m, l, o) of the union, same shapes.
    """
    m = torch.maximum(m1, m2)
    safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)   # both empty: -inf - -inf
    w1, w2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, w1 * l1 + w2 * l2, w1[..., None] * o1 + w2[..., None] * o2


# %% grade_id: softmax_kernel
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    """Row-wise softmax, one program per row: out[r, :n_cols] = softmax(x[r, :n_cols]).

    Row r of x starts at x_ptr + r * x_row_stride (elements, unit stride along the row); the
    same for out. BLOCK is a power of two >= n_cols, so the whole row fits in one block: load
    it (lanes past n_cols must not count), subtract the row max, exponentiate, divide by the
    sum, store only the n_cols real entries. Compute in float32; store in out's dtype. Entries
    may be -inf; every row has at least one finite entry. No loops: the row is one block.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    out = p / tl.sum(p, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)
