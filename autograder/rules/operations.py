"""The torch operations learner code may run, per exercise, checked below the names.

Every exercise that forbids a function (``@exercise(..., forbid=[...])``) runs under an
allow-list of aten operations (``autograder.boundary.guard.operation_limit``, a dispatch mode in
the worker, installed before any learner cell): ``BASIC`` — the arithmetic, reductions, matmuls,
views, indexing and creation a from-scratch solution is made of — plus the exercise's own
``EXTRA``. Whatever the Python name a cell reaches it through (an alias, a module's fast path,
a private function), an operation outside the set refuses the call, and the whole exercise
scores 0 with a message naming the operation (``refusal_message``). The forbid lists of names
stay as the friendly first check on the cell's source.

The same dispatch mode records the work of each call (``learner.last_call_work``: matmul FLOPs,
the FLOPs of every elementwise product of two tensors whatever made its factors, elements
exponentiated). ``require_one_pass`` turns it into a technique check: right numbers computed in
two passes, or with scores recomputed, do more work than one pass can, however the products
were written (a matmul, a broadcast product, factors copied to full size and multiplied).
"""
from __future__ import annotations

import re
from typing import Any

from autograder.boundary.exits import DOORS, ROUTES
from autograder.rules.feedback import PrerequisiteFailed
from autograder.rules.forbid import OUTSIDE_TORCH

_VIEWS = """view _unsafe_view reshape _reshape_alias expand expand_as view_as transpose t permute
    unsqueeze squeeze select slice narrow split split_with_sizes unbind chunk alias as_strided
    detach clone contiguous flatten unflatten movedim diagonal unfold"""
_CREATION = """empty empty_like empty_strided zeros zeros_like ones ones_like full full_like
    arange linspace eye scalar_tensor lift_fresh lift_fresh_copy new_empty new_empty_strided
    new_full new_zeros new_ones fill_ zero_ copy_ _to_copy to tril triu tril_ triu_
    randn randn_like rand rand_like randint randperm normal_ uniform_ random_ multinomial
    bernoulli exponential_"""
_INDEXING = """index index_select gather scatter scatter_ scatter_add scatter_add_ index_put
    index_put_ index_add index_add_ index_copy index_copy_ index_fill_ masked_fill masked_fill_
    masked_select masked_scatter where nonzero cat stack repeat repeat_interleave flip roll
    slice_scatter select_scatter narrow_copy
    _local_scalar_dense is_nonzero equal item"""
_ARITHMETIC = """add add_ sub sub_ rsub mul mul_ div div_ neg neg_ exp exp_ exp2 expm1 log log_
    log2 log1p sqrt rsqrt pow pow_ abs abs_ reciprocal maximum minimum fmax fmin clamp clamp_
    clamp_min clamp_min_ clamp_max clamp_max_ floor ceil round trunc frac remainder fmod
    floor_divide sign square addcmul addcdiv lerp nan_to_num isnan isinf isfinite isneginf
    isposinf eq ne lt le gt ge logical_and logical_or logical_not logical_xor bitwise_and
    bitwise_or bitwise_or_ bitwise_and_ bitwise_not bitwise_xor"""
_REDUCTIONS = """sum mean amax amin max min argmax argmin prod any all cumsum cumsum_ cummax cummin sort topk
    kthvalue count_nonzero"""
_MATMUL = """mm bmm addmm baddbmm addbmm matmul einsum dot mv vdot outer"""
BASIC = frozenset(f"aten.{name}" for group in (_VIEWS, _CREATION, _INDEXING, _ARITHMETIC,
                                                _REDUCTIONS, _MATMUL) for name in group.split())

# What an exercise may run besides BASIC: softmax where attention, not softmax, is the exercise
# (``aten.softmax`` is the name the dispatcher shows under ``torch.inference_mode``).
EXTRA: dict[str, frozenset[str]] = {
    grade_id: frozenset({"aten._softmax", "aten.softmax"})
    for grade_id in ("causal_attention", "decode_attention", "gqa_attention",
                     "paged_attention_gather")}

# What an exercise may not run although BASIC has it: its technique is to avoid it. GQA shares
# each K/V head with a group of query heads without copying it, so no operation that copies a
# tensor (a per-head copy of K or V, a broadcasting matmul that materialises one) is allowed.
COPIES = frozenset(f"aten.{name}" for name in """clone contiguous repeat repeat_interleave
    index index_select gather cat stack copy_ _to_copy to expand_copy""".split())
WITHOUT: dict[str, frozenset[str]] = {"gqa_attention": COPIES}
WITHOUT_HINTS = {
    "gqa_attention": "grouped-query attention shares each K/V head with its group of query heads "
                     "without copying K or V: reshape the group's query heads into the rows of one "
                     "matmul ([B, Hkv, group*T, D] @ kᵀ) instead of repeating K/V per query head "
                     "(a broadcasting matmul over a size-1 head axis copies K per head too)",
}

# Friendly words for the operations a cell is likely to reach: what it is, what to do instead.
HINTS = {
    "aten._softmax": "softmax (torch.softmax, F.softmax, Tensor.softmax, softmin) is what this "
                     "exercise asks you to write: subtract the running max, exp, divide by the sum",
    "aten.softmax": "softmax (torch.softmax, F.softmax, Tensor.softmax) is what this exercise "
                    "asks you to write: subtract the running max, exp, divide by the sum",
    "aten.scaled_dot_product_attention": "that is torch's own attention: compute the scores, "
                                         "the softmax and the weighted sum yourself",
    "aten.linear": "a linear layer (a module's projection): this exercise needs no weights",
    "aten._log_softmax": "log_softmax normalises for you: write the max, exp and sum yourself",
    "aten.logsumexp": "logsumexp is the normaliser this exercise is about: keep m and l yourself",
    "aten.logcumsumexp": "logcumsumexp is a running normaliser: keep m and l yourself, tile by tile",
    "aten.linalg_vector_norm": "normalising with a norm skips the max and the sum you are asked "
                               "to keep",
    "aten.sigmoid": "a sigmoid is a two-way softmax: write the normaliser yourself",
    "aten._scaled_dot_product_flash_attention_for_cpu": "that is torch's own attention "
                                                        "(scaled_dot_product_attention)",
    "aten._scaled_dot_product_attention_math": "that is torch's own attention "
                                               "(scaled_dot_product_attention)",
    "aten._native_multi_head_attention": "that is torch's MultiheadAttention fast path: "
                                         "compute the scores and the weighted sum yourself",
}


# Exercises that forbid nothing but whose grader reads ``learner.largest_allocation`` (the
# operations are recorded only under a limit): a KV cache's append writes in place.
RECORDED = frozenset({"KVCache"})


def allowed_operations(exercise: Any) -> frozenset[str] | None:
    """The operations the learner's code may run while ``exercise`` is graded; ``None`` (no
    limit) for an exercise that forbids nothing and is not ``RECORDED``. A kernel launch is
    never limited (its cell must be Triton code, checked on its source by ``kernel_rules``)."""
    if exercise is None or not (getattr(exercise, "forbid", ()) or exercise.grade_id in RECORDED):
        return None
    grade_id = exercise.grade_id
    return (BASIC | EXTRA.get(grade_id, frozenset())) - WITHOUT.get(grade_id, frozenset())


def refusal_message(grade_id: str, names: list[str], where: str = "") -> str:
    """Why the exercise scores 0: which operations ran that it does not allow, from which of the
    learner's lines (``where``: `` (line N of cell `x`: code)``), and what each is (``HINTS``,
    also for a function named on that line whose operation reached the dispatcher under another
    name: ``F.linear`` of a vector runs ``aten.squeeze_`` first); which doors out of torch
    (``boundary.exits.DOORS``) and which routes around the recorder (``boundary.exits.ROUTES``: a
    tensor subclass, another thread or process, a dispatch switch) learner code took."""
    exits = [n for n in names if n in DOORS]
    routes = [n for n in names if n in ROUTES]
    names = [n for n in names if n not in DOORS and n not in ROUTES]
    lines = [f"`{grade_id}` worked outside torch's operations: {'; '.join(DOORS[n] for n in exits)}. "
             f"The exercise scores 0: {OUTSIDE_TORCH}"] if exits else []
    lines += [f"`{grade_id}` ran work where the grader does not record it: "
              f"{'; '.join(ROUTES[n] for n in routes)}. The exercise scores 0: write it as plain "
              "torch operations on plain tensors, in the thread that calls it"] if routes else []
    if not names:
        return "\n".join(lines)
    without = WITHOUT.get(grade_id, frozenset())
    build = (f"Build it from views (slicing, view, reshape, transpose, unsqueeze, expand), "
             f"arithmetic, reductions and matmuls: this exercise refuses every operation that copies "
             f"a tensor ({', '.join(sorted(n.removeprefix('aten.') for n in without))})."
             if without else "Build it from arithmetic, reductions, matmuls and indexing.")
    lines += [f"`{grade_id}` ran {', '.join(names)}{where}: not among the operations this "
              "exercise allows, whatever name reaches it (an alias, a module, a private function), "
              f"so the exercise scores 0. {build}"]
    code = where.split(": ", 1)[1] if ": " in where else ""
    named = [op for op in HINTS if op not in names
             and re.search(rf"\b{re.escape(op.removeprefix('aten.').lstrip('_'))}\s*\(", code)]
    hints = [f"{name}: {HINTS[name]}" for name in [*names, *named] if name in HINTS]
    lines += list(dict.fromkeys(hints))
    if any(name in without for name in names):
        lines.append(WITHOUT_HINTS[grade_id])
    return "\n".join(lines)


WORK_SLACK = 1.25   # a call may do this many times one pass's work (helpers, guards, padding)
WORK_FLOOR = 0.75   # and must record at least this share of the work its visible scores take
READ_SLACK = 16     # values a call may read one at a time besides those of its rows and tiles


def require_one_pass(learner: Any, call: str, *, matmul_flops: int = 0,
                     elementwise_products: int = 0, exp_elements: int = 0, exp_rescales: int = 0,
                     visible_scores: int = 0, head_dim: int = 0, reads: int | None = None,
                     why: str, rule: str) -> None:
    """``PrerequisiteFailed`` where the learner's last call (``learner.last_call_work``) did
    more than ``WORK_SLACK`` times the work of one pass.

    Products: one pass computes ``matmul_flops`` FLOPs of matrix products and
    ``elementwise_products`` elementwise products of two tensors (its rescales ``acc * alpha``,
    ``l * alpha`` and the final ``acc / l``: an explicit allowance, 2 FLOPs each as the
    recorder counts them). The call's products of every kind (``CallWork.product_flops``: matmuls,
    broadcast products, and every elementwise product of two tensors however its factors were
    made) must stay within ``WORK_SLACK`` of their sum: a second pass over the scores costs the
    same whether it is a matmul or factors copied to full size, multiplied and summed.
    Exponentials: ``exp_elements`` (``exp_rescales`` of them rescale factors, which may be taken
    twice). ``why``: what one pass is and why it is the point; ``rule``: the method in a few
    words. Nothing is checked where the learner records no work.

    The floor: work done outside torch's operations (numpy, Python arithmetic on ``float(t)``
    values) is not recorded, so a call must record at least ``WORK_FLOOR`` of what its
    ``visible_scores`` take however they are computed: one exponential each and, with
    ``head_dim``, the products of q kᵀ and p v (4 * head_dim FLOPs each, as the recorder counts
    a matmul or a broadcast or elementwise product); below it, ``PrerequisiteFailed``. Nor may
    it read more than ``reads`` (one per row and tile: a guard, a loop bound) plus
    ``READ_SLACK`` values out of tensors one at a time (``float(t)``, ``.item()``): a pass over
    the scores computed in Python on such values (a max pass beside one pass in torch) does
    not show as missing work, but needs every q and k value."""
    work = getattr(learner, "last_call_work", None)
    if work is None:
        return
    _require_torch_work(work, call, visible_scores, head_dim, reads)
    over, notes = [], []
    one_pass = matmul_flops + 2 * elementwise_products
    elementwise = getattr(work, "elementwise_flops", 0)
    done = work.matmul_flops + elementwise
    if matmul_flops and done > WORK_SLACK * one_pass:
        counted = (f"{work.matmul_flops:,} in matrix and broadcast products and {elementwise:,} in "
                   "elementwise products of two tensors" if elementwise else
                   "all in matrix and broadcast products")
        over.append(f"{done / one_pass:.2f} times the product work of one pass ({done:,} FLOPs, "
                    f"{counted}, where one pass takes {one_pass:,}: {matmul_flops:,} in its matrix "
                    f"products and {2 * elementwise_products:,} in the {elementwise_products:,} "
                    "elementwise products allowed for its rescales: acc * alpha, l * alpha, "
                    "acc / l)")
        if elementwise > WORK_SLACK * 2 * elementwise_products:
            notes.append("Every elementwise product of two tensors counts, however its factors were "
                         "made: factors copied to the size of the result (repeat, tile, "
                         "expand(...).contiguous(), index_select, cat) and multiplied, then summed, "
                         "are a matrix product by another name, 2 FLOPs a term like a matmul")
    if exp_elements and work.exp_elements > WORK_SLACK * exp_elements + exp_rescales:
        over.append(f"{work.exp_elements / exp_elements:.2f} times the exponentials of one pass "
                    f"({work.exp_elements:,} where one pass takes {exp_elements:,})")
    if over:
        raise PrerequisiteFailed(". ".join([f"{call} did {' and '.join(over)}", *notes, why,
                                            "The exercise scores 0 until the work is that of one pass"]),
                                 rule=rule)


def _require_torch_work(work: Any, call: str, visible_scores: int, head_dim: int,
                        reads: int | None) -> None:
    """``PrerequisiteFailed`` where ``work`` is below ``WORK_FLOOR`` of what the visible scores
    take, or read more values one at a time than ``reads`` allows (see ``require_one_pass``)."""
    products, least = work.matmul_flops + getattr(work, "elementwise_flops", 0), 4 * head_dim
    missing = [f"{products:,} FLOPs of products where q kᵀ and p v over them take "
               f"{least * visible_scores:,}"] if products < WORK_FLOOR * least * visible_scores else []
    if work.exp_elements < WORK_FLOOR * visible_scores:
        missing.append(f"{work.exp_elements:,} exponentials where they take one each")
    if missing:
        raise PrerequisiteFailed(
            f"{call} has {visible_scores:,} visible scores, and torch recorded "
            f"{' and '.join(missing)}: the work was not done with torch operations the grader "
            f"can see. The exercise scores 0 until it is: {OUTSIDE_TORCH}",
            rule="the work done with torch operations")
    read = getattr(work, "scalar_reads", 0)
    if reads is not None and read > reads + READ_SLACK:
        raise PrerequisiteFailed(
            f"{call} read {read:,} values out of tensors one at a time (float(t), .item(), "
            f"int(t), bool(t); printing a tensor reads all its values), where one per row and "
            f"tile is plenty ({reads + READ_SLACK:,}): "
            "arithmetic on them in Python is not work the grader can see. The exercise scores 0 "
            f"until it works on tensors: {OUTSIDE_TORCH}",
            rule="the work done with torch operations")
