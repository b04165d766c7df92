"""Solutions of exercises/ch06_online_softmax.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch06_online_softmax")``; never imported as a
module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: online_softmax_update
def online_softmax_update(m: Tensor, l: Tensor, tile_scores: Tensor) -> tuple[Tensor, Tensor]:
    """One step of the online softmax: fold one more tile of scores into the running state.

    m, l [...]: the state of the columns read so far, per row: their max m and the sum
    l = sum exp(s - m) ((-inf, 0) when no column has been read, or all were -inf).
    tile_scores [..., T] (T >= 1): the next T columns of the same rows; entries may be -inf.
    Returns (m_new, l_new), shape [...] and dtype of m: m_new = max(m, max of the tile) and
    l_new = l * exp(m - m_new) + sum exp(tile - m_new) (the old sum re-measured from the new
    max). A row whose state and tile are all -inf stays (-inf, 0), without NaN.
    The state may come from columns you never saw: it is all you know about them.
    torch.softmax, F.softmax, logsumexp and the other one-line normalisers are not allowed.
    """
    m_new = torch.maximum(m, tile_scores.amax(dim=-1))
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # nothing yet
    l_new = l * torch.exp(m - safe) + torch.exp(tile_scores - safe[..., None]).sum(dim=-1)
    return m_new, l_new


# %% grade_id: online_softmax
def online_softmax(scores: Tensor, tile: int) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax over the last dim of `scores` [..., N], reading `tile` columns at a time.

    Start from the empty state (m, l) = (-inf, 0) per row and fold in the tiles
    scores[..., 0:tile], scores[..., tile:2*tile], ... in order (the last may be shorter) with
    the update of exercise 1 (call your online_softmax_update, or write the same step here),
    recording the state after every tile. A final sweep writes exp(s - m) / l with the last
    state. Entries may be -inf (probability 0); every row has at least one finite entry, but
    a whole tile of a row may be -inf.

    Returns (probs [..., N] like scores, m [..., n_tiles], l [..., n_tiles]), n_tiles =
    ceil(N / tile): m[..., t] and l[..., t] are the running max and sum after tile t (over
    columns 0 .. (t + 1) * tile - 1), in scores' dtype; the last column is the row's max and
    sum. torch.softmax, F.softmax, logsumexp and the other one-line normalisers are not
    allowed. Raises ValueError if tile < 1.
    """
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    m = torch.full(scores.shape[:-1], float("-inf"), dtype=scores.dtype)
    l = torch.zeros_like(m)
    ms, ls = [], []
    for start in range(0, scores.shape[-1], tile):
        block = scores[..., start:start + tile]
        m_new = torch.maximum(m, block.amax(dim=-1))
        safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # all -inf so far
        l = l * torch.exp(m - safe) + torch.exp(block - safe[..., None]).sum(dim=-1)
        m = m_new
        ms.append(m)
        ls.append(l)
    return torch.exp(scores - m[..., None]) / l[..., None], torch.stack(ms, -1), torch.stack(ls, -1)


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


# %% grade_id: online_softmax_kernel
import triton
import triton.language as tl


@triton.jit
def online_softmax_kernel(x_ptr, out_ptr, m_ptr, l_ptr, n_cols, x_row_stride, out_row_stride,
                          BLOCK: tl.constexpr):
    """Row-wise softmax of rows longer than one block: one program per row, two sweeps.

    Row r of x starts at x_ptr + r * x_row_stride (elements, unit stride along the row); the
    same for out. A row has n_cols columns in n_blocks = cdiv(n_cols, BLOCK) blocks (BLOCK is a
    power of two; the last block may be partial). Sweep 1 loads the row one block at a time
    and folds each block into the running max m and sum l = sum exp(x - m) (the online
    softmax update); after block j it stores the row's state, float32, at
    m_ptr + r * n_blocks + j and l_ptr + r * n_blocks + j. Sweep 2 loads the row again and
    stores exp(x - m) / l in out's dtype, for the n_cols real entries only. Compute in
    float32. Entries may be -inf (whole blocks of them); every row has a finite entry.
    """
    row = tl.program_id(0).to(tl.int64)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    x_row = x_ptr + row * x_row_stride
    cols = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.zeros([], tl.float32)
    for j in range(0, n_blocks):
        offsets = j * BLOCK + cols
        x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # nothing finite read yet
        l = l * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)
        m = m_new
        tl.store(m_ptr + row * n_blocks + j, m)
        tl.store(l_ptr + row * n_blocks + j, l)
    for j in range(0, n_blocks):
        offsets = j * BLOCK + cols
        x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf")).to(tl.float32)
        p = tl.exp(x - m) / l
        tl.store(out_ptr + row * out_row_stride + offsets, p.to(out_ptr.dtype.element_ty),
                 mask=offsets < n_cols)
