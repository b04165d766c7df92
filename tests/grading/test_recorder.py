"""What the worker records of a call and the walls around the record (boundary/guard.py,
audit.py, exits.py; rules/operations.py): the allowed operations, the largest allocation, the
work counted exactly, the floors, and no cell able to switch the recorder off."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder.local import LocalLearner


ROOT = Path(__file__).resolve().parents[2]


def test_the_audit_wall_refuses_introspection_only_to_learner_code(tmp_path):
    """In a process of its own (an audit hook stays): a cell's code asking for the garbage
    collector, frames, ctypes or pickled classes is refused, library code doing so for itself
    is not, nor is the same code outside learner calls (tests/fixtures/audit_probe.py)."""
    run = subprocess.run([sys.executable, str(ROOT / "tests/fixtures/audit_probe.py"),
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    verdicts = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert verdicts == {"gc": "refused", "walk_stack": "refused", "tb_frame": "refused",
                        "cast": "refused", "from_address": "refused", "pickle": "refused",
                        "namedtuple": "allowed", "library": "allowed", "outside": "allowed"}


def test_the_exits_wall_refuses_numpy_and_dlpack_only_to_learner_code_under_a_limit(tmp_path):
    """In a process of its own (the doors stay wrapped): a cell handing a tensor to numpy
    (np.asarray, a numpy function, np.from_dlpack, x.numpy()) or to Python lists (x.tolist()),
    or making a tensor over memory from outside torch (torch.frombuffer), under an operation
    limit is refused, and the refusal is kept in the limit even when the cell
    catches it; printing a tensor (its values counted as reads), library code doing the same for
    itself, and the cell outside a limit are not (tests/fixtures/exits_probe.py)."""
    run = subprocess.run([sys.executable, str(ROOT / "tests/fixtures/exits_probe.py"),
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    verdicts, recorded = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert verdicts == {"asarray": "refused", "repeat": "refused", "from_dlpack": "refused",
                        "numpy": "refused", "tolist": "refused", "frombuffer": "refused",
                        "caught": "allowed",
                        "printed": "allowed", "library": "allowed", "no limit": "allowed"}
    assert recorded == {"asarray": ["torch.Tensor.__array__"], "repeat": ["torch.Tensor.__array__"],
                        "from_dlpack": ["torch.Tensor.__dlpack__"], "numpy": ["torch.Tensor.numpy"],
                        "tolist": ["torch.Tensor.tolist"], "frombuffer": ["torch.frombuffer"],
                        "caught": ["torch.Tensor.__array__"],
                        "printed": ["reads 6"], "library": []}


def test_the_routes_around_the_recorder_are_refused_whatever_reaches_them(tmp_path):
    """In a process of its own (the switches stay wrapped): a cell runs work (an exp) where the
    recorder is not: in a tensor subclass's __torch_dispatch__ (torch runs it with the modes set
    aside), in a nested jagged tensor (a subclass too), in a thread pool or asyncio.to_thread,
    with the dispatch modes disabled, the Python key excluded, an operation redispatched below
    the modes, a Python kernel registered for an aten operation, in a forked process. Each is
    refused and kept in the limit's refusals (caught or not: the exercise scores 0); printing a
    tensor deep in library code is not; a thread started at a cell's load is refused too
    (tests/fixtures/routes_probe.py)."""
    run = subprocess.run([sys.executable, str(ROOT / "tests/fixtures/routes_probe.py"),
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    verdicts = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    kept = {"subclass": "tensor subclass", "nested": "dispatch switch", "thread_pool": "another thread",
            "to_thread": "another thread", "modes_off": "dispatch switch", "key_excluded": "dispatch switch",
            "redispatch": "dispatch switch", "fork": "another process", "caught": "another thread",
            "signal_handler": "a signal handler", "mode_left": "a torch function mode left on"}
    for probe, route in kept.items():
        raised, refused, _ = verdicts[probe]
        assert route in refused, (probe, verdicts[probe])
        assert raised is not None or probe == "caught", (probe, verdicts[probe])
    assert verdicts["kernel"][0] == "IntrospectionRefused", verdicts["kernel"]  # Library reads its caller's frame
    assert verdicts["library"] == (None, [], 0)
    assert verdicts["cell load thread"] == "refused" and verdicts["outside learner code"] == "allowed"


def test_a_call_may_return_plain_tensors_only():
    """A subclass returned (or inside a returned tuple) would run its own methods in the worker's
    conversion, after the recorded call: refused before any of them runs."""
    from autograder.boundary.causes import LearnerError
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    cells = [("lazy", "class Lazy(torch.Tensor):\n    pass\n\n"
                      "def lazy(x):\n    return x * 2, (x + 1).as_subclass(Lazy)\n"),
             ("plain", "def plain(x):\n    return x * 2, torch.nn.Parameter(x + 1)\n")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        x = torch.randn(3)
        learner.begin(Exercise("plain", 1))
        doubled, parameter = learner.call("plain", x)
        assert type(parameter) is torch.Tensor and torch.equal(parameter, x + 1)
        with pytest.raises(LearnerError, match="a Lazy, a subclass of torch.Tensor"):
            learner.call("lazy", x)
    finally:
        learner.close()


def test_the_conversion_of_a_result_runs_no_learner_code():
    """After the recorded call the worker copies the result: deciding on ``type(value)`` (never
    ``isinstance``, which asks the object for its ``__class__``) and with torch functions'
    overrides off, so neither a ``__class__`` property of a returned tuple nor a torch function
    mode runs there, where nothing is recorded."""
    from autograder.boundary.guard import limits_paused
    from autograder.boundary.proxies import LearnerSide
    ran = []
    lying = type("Lying", (tuple,), {"__class__": property(lambda self: ran.append(1) or tuple)})
    side = LearnerSide(lambda request: {})
    x = torch.randn(3)
    copied = side.result(lying((x, x + 1)))
    assert type(copied) is tuple and torch.equal(copied[1], x + 1) and not ran

    from torch.overrides import TorchFunctionMode

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            ran.append(func)
            return func(*args, **(kwargs or {}))

    with Seen(), limits_paused():
        side.result(x)
    assert not ran

    # a scalar's subclass (numpy's float64 is one) comes back as the plain value, read through
    # the base class's conversion, not the subclass's own
    import numpy
    loud = type("Loud", (float,), {"__float__": lambda self: ran.append(1) or 0.0})
    for value, plain in ((numpy.float64(2.5), 2.5), (loud(1.5), 1.5)):
        copied = side.result(value)
        assert type(copied) is float and copied == plain
    assert not ran


def test_an_operation_outside_the_allowed_set_refuses_the_call_even_when_caught():
    """Below the names: the dispatcher sees aten._softmax whatever reached it, and catching the
    refusal does not hide it (the exercise scores 0, as for a failed prerequisite)."""
    from autograder.boundary.causes import OperationRefused
    from autograder.rules.plugin import Exercise
    namespace = {"torch": torch,
                 "alias": lambda x: torch.special.softmax(x, -1),   # no forbidden name in sight
                 "caught": lambda x: _swallow(lambda: x.softmax(-1), x),
                 "honest": lambda x: (x - x.amax(-1, keepdim=True)).exp()
                 / (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)}
    learner = LocalLearner(namespace)
    learner.begin(Exercise("online_softmax", 1, forbid=("torch.softmax",)))
    x = torch.randn(3, 5)
    torch.testing.assert_close(learner.call("honest", x), torch.softmax(x, -1))
    for name in ("alias", "caught"):
        with pytest.raises(OperationRefused, match=r"aten\._softmax.*\n.*subtract the running max"):
            learner.call(name, x)
    learner.begin(Exercise("causal_attention", 1, forbid=("torch.nn.functional.scaled_dot_product_attention",)))
    torch.testing.assert_close(learner.call("alias", x), torch.softmax(x, -1))  # allowed there


def _swallow(fn, x):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - the learner catches the refusal and answers anyway
        return torch.softmax(x.double(), -1).float()


def test_the_worker_refuses_an_operation_outside_the_allowed_set():
    """Through the sandbox: the dispatch mode runs in the worker, the verdict comes back as
    ``OperationRefused`` (the exercise's gate); the proxies' own copies are not counted."""
    from autograder.boundary.causes import OperationRefused
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    cells = [("norm", "def norm(x):\n    e = (x - x.amax(-1, keepdim=True)).exp()\n"
                      "    return F.normalize(e, p=1, dim=-1)"),
             ("honest", "def honest(x):\n    e = (x - x.amax(-1, keepdim=True)).exp()\n"
                        "    return e / e.sum(-1, keepdim=True)")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        x = torch.randn(2, 6)
        learner.begin(Exercise("online_softmax", 1, forbid=("torch.softmax",)))
        torch.testing.assert_close(learner.call("honest", x), torch.softmax(x, -1))
        with pytest.raises(OperationRefused, match=r"aten\.linalg_vector_norm \(line 3 of cell "
                           r"`norm`: return F\.normalize\(e, p=1, dim=-1\)\)"):
            learner.call("norm", x)   # the learner's line that ran it
        learner.begin(Exercise("norm", 1))      # an exercise that forbids nothing: no limit
        torch.testing.assert_close(learner.call("norm", x), torch.softmax(x, -1))
    finally:
        learner.close()


def test_the_largest_allocation_of_a_call_is_recorded_on_every_size():
    """Bounded memory, seen by the dispatch mode: the whole score matrix shows up at any size,
    a tiled loop stays at a tile's size."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    cells = [("whole", "def whole(q, k):\n    return (q @ k.T).amax(-1)"),
             ("tiled", "def tiled(q, k, tile):\n    best = torch.full((q.shape[0],), float('-inf'))\n"
                       "    for j in range(0, k.shape[0], tile):\n"
                       "        best = torch.maximum(best, (q @ k[j:j + tile].T).amax(-1))\n"
                       "    return best")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        learner.begin(Exercise("whole", 1, forbid=("torch.softmax",)))
        q, k = torch.randn(48, 8), torch.randn(40, 8)
        torch.testing.assert_close(learner.call("whole", q, k), (q @ k.T).amax(-1))
        assert learner.largest_allocation == 48 * 40 * 4
        torch.testing.assert_close(learner.call("tiled", q, k, 8), (q @ k.T).amax(-1))
        assert learner.largest_allocation == 48 * 8 * 4
    finally:
        learner.close()


A, B = torch.randn(3, 4), torch.randn(4, 5)            # one [3, 4] @ [4, 5] product: 120 FLOPs


BATCH_A, BATCH_B = torch.randn(2, 3, 4), torch.randn(2, 4, 5)


# The first half of A @ B written with factors copied to the product's size [3, 5, 4]: 120 FLOPs
# of elementwise products whatever made the copies.
A_COPIES = A[:, None, :].repeat(1, 5, 1)


B_COPIES = B.T[None].repeat(3, 1, 1)


WORK_CASES = {   # what a call runs -> (matmul FLOPs, elementwise FLOPs, exponentials), by hand
    "a @ b (mm)": (lambda: A @ B, 2 * 3 * 5 * 4, 0, 0),
    "addmm": (lambda: torch.addmm(torch.zeros(3, 5), A, B), 120, 0, 0),
    "batched @ (bmm)": (lambda: BATCH_A @ BATCH_B, 2 * 2 * 3 * 5 * 4, 0, 0),
    "4-d @ (bmm of the flattened batch)": (lambda: BATCH_A[None] @ BATCH_B[None], 240, 0, 0),
    "einsum": (lambda: torch.einsum("bij,bjk->bik", BATCH_A, BATCH_B), 240, 0, 0),
    "baddbmm": (lambda: torch.baddbmm(torch.zeros(2, 3, 5), BATCH_A, BATCH_B), 240, 0, 0),
    "dot": (lambda: torch.dot(A[0], A[1]), 2 * 4, 0, 0),
    "mv": (lambda: A @ B[:, 0], 2 * 3 * 4, 0, 0),
    "broadcast product and sum (a matmul by hand)":
        (lambda: (A[:, None, :] * B.T[None, :, :]).sum(-1), 120, 0, 0),
    "the same with expanded factors": (lambda: (A[:, None, :].expand(3, 5, 4)
                                                * B.T[None].expand(3, 5, 4)).sum(-1), 120, 0, 0),
    "outer": (lambda: torch.outer(A[:, 0], B[0]), 2 * 3 * 5, 0, 0),
    # factors as large as their product, however they were copied: 2 FLOPs per product
    "factors repeated to full size, multiplied, summed":
        (lambda: (A[:, None, :].repeat(1, 5, 1) * B.T[None].repeat(3, 1, 1)).sum(-1), 0, 120, 0),
    "factors expanded, then made contiguous (copies)":
        (lambda: (A[:, None, :].expand(3, 5, 4).contiguous()
                  * B.T[None].expand(3, 5, 4).contiguous()).sum(-1), 0, 120, 0),
    "one factor copied, the other broadcast":
        (lambda: (A[:, None, :] * B.T[None].expand(3, 5, 4).contiguous()).sum(-1), 0, 120, 0),
    "repeat_interleave and tile":
        (lambda: (A.repeat_interleave(5, 0) * B.T.tile(3, 1)).sum(-1), 0, 120, 0),
    "index_select with repeated indices, and cat of copies":
        (lambda: (A.index_select(0, torch.arange(3).repeat_interleave(5))
                  * torch.cat([B.T] * 3)).sum(-1), 0, 120, 0),
    "in-place mul_ of a copy": (lambda: A_COPIES.clone().mul_(B_COPIES).sum(-1), 0, 120, 0),
    "division by the reciprocal": (lambda: (A_COPIES / B_COPIES.reciprocal()).sum(-1), 0, 120, 0),
    "addcmul and addcdiv": (lambda: (torch.addcmul(torch.zeros(3, 5, 4), A_COPIES, B_COPIES),
                                     torch.addcdiv(torch.zeros(3, 5, 4), A_COPIES, B_COPIES)),
                            0, 240, 0),
    "lerp with a tensor weight (and with a number: not a product)":
        (lambda: (torch.lerp(torch.zeros(3, 5, 4), B_COPIES, A_COPIES),
                  torch.lerp(A_COPIES, B_COPIES, 0.5)), 0, 120, 0),
    "squares: (a + b)² - (a - b)² = 4ab": (lambda: ((A_COPIES + B_COPIES) ** 2
                                                    - (A_COPIES - B_COPIES).square()), 0, 240, 0),
    "prod over a stack of the two": (lambda: torch.stack([A_COPIES, B_COPIES]).prod(0), 0, 120, 0),
    "scatter with reduce='multiply'":
        (lambda: A_COPIES.scatter(2, torch.arange(4).expand(3, 5, 4), B_COPIES, reduce="multiply"),
         0, 120, 0),
    "floor_divide, remainder and fmod by a tensor":
        (lambda: (A_COPIES // B_COPIES[:, :, :1], A_COPIES % B_COPIES, A_COPIES.fmod(B_COPIES)),
         0, 3 * 120, 0),
    "elementwise products": (lambda: A * A * A[:, :1], 0, 2 * 12 + 2 * 12, 0),
    "products by a Python number (scales)": (lambda: (A * 2.0, A / 3, 0.5 * A, A.mul(True)), 0, 0, 0),
    "exp": (lambda: torch.exp(A), 0, 0, 12),
    "in-place exp_, exp2, expm1": (lambda: (A.clone().exp_(), A.exp2(), A.expm1()), 0, 0, 36),
    "2 ** x (a power with a tensor exponent)": (lambda: 2 ** A, 0, 0, 12),
    "x ** 2 (x times x, not an exponential)": (lambda: A ** 2, 0, 24, 0),
    "x ** 0.5 (a root, not a product)": (lambda: A.abs() ** 0.5, 0, 0, 0),
    "log, max, sum": (lambda: A.log().amax(-1) + A.sum(-1), 0, 0, 0),
}


@pytest.mark.parametrize("case", list(WORK_CASES))
def test_the_work_of_a_call_is_counted_exactly(case):
    """The recorder below the names: every matrix product is 2 M N K FLOPs whatever reaches it
    (@, einsum, a broadcast product), every elementwise product of two tensors 2 FLOPs per
    element however its factors were made (copies as large as the product included), every
    exponential one element, nothing else counts."""
    import warnings

    from autograder.boundary.guard import operation_limit
    from autograder.rules.operations import BASIC
    run, flops, elementwise, exps = WORK_CASES[case]
    with operation_limit(BASIC) as limit, warnings.catch_warnings():
        warnings.simplefilter("ignore")     # scatter's reduce= is deprecated, still a product
        run()
    work = limit.work
    assert (work.matmul_flops, work.elementwise_flops, work.exp_elements) == (flops, elementwise, exps), (
        f"{case}: recorded {work}, expected {flops} matmul FLOPs, {elementwise} elementwise FLOPs "
        f"and {exps} exponentials")


def test_every_elementwise_product_among_the_allowed_operations_is_counted():
    """The operations that multiply or divide two tensors elementwise, among those an exercise
    may run (``operations.BASIC``), are the ones the recorder counts: a new product added to the
    allow-list must be counted too."""
    from autograder.boundary.guard import ELEMENTWISE_PRODUCTS
    from autograder.rules.operations import BASIC
    multiplying = {f"aten.{name}" for name in """mul mul_ div div_ addcmul addcdiv lerp pow pow_
        prod floor_divide remainder fmod scatter scatter_""".split()}
    assert multiplying <= BASIC, sorted(multiplying - BASIC)
    assert multiplying <= ELEMENTWISE_PRODUCTS, sorted(multiplying - ELEMENTWISE_PRODUCTS)


class _Worked:
    """A learner whose last call did ``work`` (what ``require_one_pass`` reads)."""

    def __init__(self, work):
        self.last_call_work = work


def test_the_work_floor_refuses_a_call_that_records_less_than_its_visible_scores_take():
    """Work done outside torch is missing from the record: below ``WORK_FLOOR`` of the products
    (q kᵀ and p v, however written) and exponentials of the visible scores, the call fails;
    one honest pass, a causal one that skips masked tiles, and products written elementwise
    pass."""
    from autograder.boundary.guard import CallWork
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import require_one_pass
    rows, keys, dim = 8, 40, 16
    visible = rows * keys // 2                              # causal: half the pairs seen
    check = dict(matmul_flops=4 * rows * keys * dim, exp_elements=rows * keys, why="WHY", rule="R")
    for honest in (CallWork(4 * rows * keys * dim, rows * keys, 0),     # every tile
                   CallWork(4 * visible * dim + 2 * rows * dim, visible, 0),   # masked tiles skipped
                   CallWork(0, visible, 4 * visible * dim)):              # elementwise products
        require_one_pass(_Worked(honest), "call", visible_scores=visible, head_dim=dim, **check)
    for outside in (CallWork(0, 0, 0), CallWork(4 * visible * dim, 0, 0), CallWork(0, visible, 0)):
        with pytest.raises(PrerequisiteFailed, match="not done with torch operations the grader "
                                                     "can see") as failed:
            require_one_pass(_Worked(outside), "call", visible_scores=visible, head_dim=dim, **check)
        assert failed.value.rule == "the work done with torch operations"
    require_one_pass(_Worked(CallWork(0, 30, 0)), "call", exp_elements=40, visible_scores=30,
                     why="WHY", rule="R")                   # exponentials only (chapter 06)
    with pytest.raises(PrerequisiteFailed, match="0 exponentials"):
        require_one_pass(_Worked(CallWork(0, 0, 0)), "call", exp_elements=40, visible_scores=30,
                         why="WHY", rule="R")


def test_values_read_one_at_a_time_are_counted_and_bounded_where_one_pass_is_checked():
    """float(t), .item(), int(t), bool(t) each count one read; a call may read one value per
    row and tile (plus READ_SLACK), not the q and k values a max pass in Python needs."""
    from autograder.boundary.guard import CallWork, operation_limit
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import BASIC, READ_SLACK, require_one_pass
    x = torch.randn(5, 4)
    with operation_limit(BASIC) as limit:
        sum(float(value) for value in x.reshape(-1)) + x.amax().item() + int(bool(x[0, 0] > 0))
    assert limit.work.scalar_reads == 20 + 1 + 1
    rows, keys, dim, tiles = 8, 40, 16, 5
    one_pass = dict(matmul_flops=4 * rows * keys * dim, exp_elements=rows * keys,
                    visible_scores=rows * keys, head_dim=dim, reads=rows + tiles, why="W", rule="R")
    work = (4 * rows * keys * dim, rows * keys, 0)
    require_one_pass(_Worked(CallWork(*work, rows + tiles + READ_SLACK)), "call", **one_pass)
    with pytest.raises(PrerequisiteFailed, match="values out of tensors one at a time"):
        require_one_pass(_Worked(CallWork(*work, (rows + keys) * dim)), "call", **one_pass)


def test_a_tensor_made_from_python_values_counts_as_an_allocation():
    """torch.tensor of a list (aten.lift_fresh, whose output shares its input's storage) is new
    memory: a copy of K made through Python numbers shows in ``largest``."""
    from autograder.boundary.guard import operation_limit
    from autograder.rules.operations import BASIC
    k = torch.randn(30, 40)
    with operation_limit(BASIC) as limit:
        copy = torch.tensor([[float(x) for x in row] for row in k])
    assert torch.equal(copy, k) and limit.largest == 30 * 40 * 4


def test_one_pass_allows_its_rescales_and_refuses_a_pass_of_copied_factors():
    """``require_one_pass`` on the products: one pass's matmuls plus the elementwise products
    it is allowed (its rescales) pass; a second pass over the scores fails whether written as a
    matmul or as copies multiplied and summed, and the message says what was counted."""
    from autograder.boundary.guard import CallWork
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import require_one_pass
    rows, keys, dim = 8, 40, 8
    matmuls = 4 * rows * keys * dim

    def one_pass(tiles):
        return dict(matmul_flops=matmuls, elementwise_products=2 * rows * tiles * (dim + 1) + rows * dim,
                    why="WHY", rule="RULE")

    rescales = 2 * (rows * 40 * (dim + 1) + rows * dim)    # 1-key tiles: the rescales weigh most
    require_one_pass(_Worked(CallWork(matmuls, 0, rescales)), "call", **one_pass(40))
    with pytest.raises(PrerequisiteFailed) as failed:      # scores of copies, 4 times over
        require_one_pass(_Worked(CallWork(matmuls, 0, rescales + 4 * matmuls // 2)), "call", **one_pass(40))
    for text in ("times the product work of one pass", "in elementwise products of two tensors",
                 "however its factors were made", "WHY"):
        assert text in str(failed.value), f"{text!r} missing from: {failed.value}"
    assert failed.value.rule == "RULE"
    rescales = 2 * (rows * 5 * (dim + 1) + rows * dim)     # 8-key tiles
    require_one_pass(_Worked(CallWork(matmuls, 0, rescales)), "call", **one_pass(5))
    for second_pass in (CallWork(matmuls * 3 // 2, 0, rescales), CallWork(matmuls, 0, rescales + matmuls // 2)):
        with pytest.raises(PrerequisiteFailed, match="times the product work of one pass"):
            require_one_pass(_Worked(second_pass), "call", **one_pass(5))


@pytest.mark.parametrize("exercise", ["attend_tile", "tiled_attention"])
def test_the_chapter_05_solutions_and_two_passes_of_copies_across_the_graders_sizes(exercise):
    """On the sizes the grader draws (its own case generators, many seeds; small head dims and
    1-key tiles, where the rescales weigh most), the solution passes ``require_one_pass`` and a
    second pass of scores made of copied factors (repeat, multiply, sum) fails."""
    import selfcheck
    from autograder.boundary.guard import operation_limit
    from autograder.local import base_namespace, load_graders
    from autograder.rules.feedback import PrerequisiteFailed
    from autograder.rules.operations import BASIC
    from autograder.solutions import load_solutions
    load_graders()
    grader = sys.modules["_autograder_graders.ch05_flash_attention"]
    cheat = next(s.source for s in selfcheck.variants("ch05_flash_attention")["cheat"][exercise]
                 if "repeat" in s.label and "two passes" in s.label)
    sources = {"solution": load_solutions("ch05_flash_attention")[exercise], "cheat": cheat}

    class Learner:
        def __init__(self, source):
            self.namespace = base_namespace()
            exec(source, self.namespace)
            self.calls = self.refused = 0

        def call(self, name, *args, **kwargs):
            with operation_limit(BASIC) as limit:
                out = self.namespace[name](*args, **kwargs)
            self.last_call_work, self.largest_allocation = limit.work, limit.largest
            return out

    def calls(learner, seed):
        """Every call of the exercise's tests with ``seed``, the one-pass check counted."""
        check = grader.require_one_pass

        def counted(*args, **kwargs):
            learner.calls += 1
            try:
                check(*args, **kwargs)
            except PrerequisiteFailed:
                learner.refused += 1

        grader.require_one_pass = counted
        try:
            tests = ([grader.test_attend_tile_driven_key_tile_by_key_tile,
                      grader.test_attend_tile_from_states_the_grader_picks]
                     if exercise == "attend_tile" else
                     [grader.test_tiled_attention_matches_attention, grader.test_tiled_attention_causal,
                      grader.test_tiled_attention_large_scores])
            for test in tests:
                try:
                    test(learner, seed)
                except PrerequisiteFailed as exc:     # the memory check, on copies of a tile
                    assert "whole" in str(exc) and learner is copies, exc
        finally:
            grader.require_one_pass = check

    honest, copies = Learner(sources["solution"]), Learner(sources["cheat"])
    for seed in range(6 if exercise == "attend_tile" else 3):
        calls(honest, seed)
        calls(copies, seed)
    assert honest.calls > 30 and honest.refused == 0, f"{honest.refused} of {honest.calls} honest calls refused"
    assert copies.refused >= copies.calls / 2, f"only {copies.refused} of {copies.calls} two-pass calls refused"


def test_the_work_of_the_last_call_comes_back_from_the_worker():
    """``learner.last_call_work`` is the last call's own work (not the sum of calls), sent
    over the wire from the sandbox worker (its elementwise products too); an exercise without
    a limit records none."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    cells = [("scores", "def scores(q, k, times):\n"
                        "    return [torch.exp(q @ k.T) for _ in range(times)][-1]"),
             ("copies", "def copies(q, k):\n"
                        "    n, m = q.shape[0], k.shape[0]\n"
                        "    return (q[:, None].repeat(1, m, 1) * k[None].repeat(n, 1, 1)).sum(-1)")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        q, k = torch.randn(6, 8), torch.randn(5, 8)
        learner.begin(Exercise("scores", 1, forbid=("torch.softmax",)))
        for times in (2, 1):
            learner.call("scores", q, k, times)
            work = learner.last_call_work
            assert (work.matmul_flops, work.exp_elements) == (times * 2 * 6 * 5 * 8, times * 30)
            assert work.elementwise_flops == 0
        torch.testing.assert_close(learner.call("copies", q, k), q @ k.T)
        work = learner.last_call_work
        assert (work.matmul_flops, work.elementwise_flops) == (0, 2 * 6 * 5 * 8), work
        learner.begin(Exercise("scores", 1))
        learner.call("scores", q, k, 1)
        assert (learner.last_call_work.matmul_flops, learner.last_call_work.exp_elements) == (0, 0)
    finally:
        learner.close()


def test_a_changed_operation_recorder_is_found(monkeypatch):
    """The worker checks after every call that nothing the operation recorder rests on was
    rebound: an entry of its work tables, a function of its module, a method of its mode."""
    from autograder.boundary import guard, traffic
    from autograder.boundary.worker import RECORDER_PLACES, recorder_places
    traffic.install(recorder_places())
    assert traffic.tampered(RECORDER_PLACES) == []
    monkeypatch.setitem(guard._PRODUCT_FLOPS, "aten.mm", lambda args, out: 0)
    monkeypatch.setattr(guard, "_allocated", lambda *a: 0)
    monkeypatch.setattr(guard._limit_mode(), "__torch_dispatch__", lambda *a, **k: None)
    assert traffic.tampered(RECORDER_PLACES) == ["OperationLimit.__torch_dispatch__",
                                                 "guard._allocated", "product_flops.aten.mm"]
    # torch's own dispatch-mode machinery: a mode never pushed records nothing
    from torch.utils import _python_dispatch
    monkeypatch.setattr(_python_dispatch, "_push_mode", lambda *a: None)
    monkeypatch.setattr(torch._C, "_pop_torch_dispatch_stack", lambda *a: None)
    assert {"python_dispatch._push_mode", "dispatch_stack._pop_torch_dispatch_stack"} \
        <= set(traffic.tampered(RECORDER_PLACES))


# A cell of another exercise (one that records nothing, so its own cell is never looked at)
# reaching the operation recorder before the limited exercise runs: a torch._dynamo of its own
# (torch would wrap the mode's dispatch with its `disable` at the first limited operation), or
# torch's dispatch-mode stack made a no-op. attend_tile then runs a forbidden operation.
HELPER_ATTACKS = {
    "fake dynamo": ("import sys, types, torch\n"
                    "fake = types.ModuleType('torch._dynamo')\n"
                    "def disable(fn, recursive=True, wrapping=False):\n"
                    "    return lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))\n"
                    "fake.disable = disable\n"
                    "sys.modules['torch._dynamo'] = torch._dynamo = fake\n",
                    "`_dynamo`", "ran aten._softmax"),
    "no mode stack": ("import torch.utils._python_dispatch as pd\n"
                      "pd._push_mode = lambda mode, k=None: None\n"
                      "pd._pop_mode = lambda k=None: None\n",
                      "`_python_dispatch`", "python_dispatch._push_mode"),
}


FUSED = ("import torch\n"
         "def helper(x):\n"
         "    return torch.ops.aten._softmax.default(x, -1, False)\n")


@pytest.mark.parametrize("attack", list(HELPER_ATTACKS))
def test_another_cell_cannot_switch_the_operation_recorder_off(attack):
    """Both walls: the static look now covers every cell the worker runs (whichever exercise it
    belongs to), and at run time the mode never imports torch._dynamo and watches torch's
    dispatch machinery. The run-time wall is shown alone by calling the sandbox directly."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import REGISTRY, other_cells_problem
    from autograder.grading import chapter_graders
    chapter_graders()
    code, static_name, runtime_message = HELPER_ATTACKS[attack]
    cells = [("flash_hbm_bytes", code + FUSED),
             ("attend_tile", "def attend_tile(s):\n    return helper(s)\n")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        entry = REGISTRY["attend_tile"]
        problem = other_cells_problem(learner, entry)
        assert "your `flash_hbm_bytes` cell uses" in problem and static_name in problem
        assert "`attend_tile` scores 0" in problem
        learner.start()
        assert learner.cell_errors == {}
        learner.begin(entry)
        with pytest.raises(AssertionError, match=runtime_message.replace(".", r"\.")):
            learner.call("attend_tile", torch.randn(3, 4))
    finally:
        learner.close()



def test_the_bytes_a_call_allocates_are_counted_in_total():
    """Every new tensor an operation makes counts in ``work.allocated_bytes`` (a view, an in-place
    write and a copy into an existing tensor do not): a copy cut into small pieces adds up to
    the whole, which the largest allocation alone never shows."""
    from autograder.boundary.guard import operation_limit
    from autograder.rules.operations import BASIC
    x, buffer = torch.randn(6, 8), torch.zeros(6, 8)
    limit = operation_limit(BASIC)
    with limit:
        x[:, :2].transpose(0, 1)               # views: nothing made
        buffer[:, :4] = x[:, :4]               # a copy into the buffer: nothing made
        x.add_(1)                              # in place: nothing made
        pieces = [x[i:i + 2] * 1.0 for i in range(0, 6, 2)]   # three pieces of 2 x 8
        torch.cat(pieces)                      # and their concatenation, 6 x 8
        torch.tensor([1.0, 2.0])               # a tensor from Python values: 2 x 4 bytes
    assert limit.work.allocated_bytes == 3 * 2 * 8 * 4 + 6 * 8 * 4 + 2 * 4
    assert limit.largest == 6 * 8 * 4


LEFTOVERS = '''
import sys
import weakref

seen = []   # (route, whether the walls stood there: sys._getframe refused)


def walls(route):
    try:
        sys._getframe()
        seen.append((route, False))
    except ValueError:
        seen.append((route, True))


class Lazy:
    """append only queues; reading ``total`` does the work, in a property."""
    def __init__(self):
        self.queue = []

    def append(self, x):
        self.queue.append(x)

    @property
    def total(self):
        walls("property")
        return torch.stack(self.queue).softmax(-1)


class Loud(Exception):
    def __str__(self):
        walls("exception message")
        try:
            torch.ones(2).softmax(-1)
            seen.append(("operation in the message", "ran"))
        except RuntimeError:
            seen.append(("operation in the message", "refused"))
        return "loud"


class Stream:
    def write(self, text):
        return len(text)

    def flush(self):
        walls("stream flush")


def leaves(x):
    doubled = x * 2
    weakref.finalize(doubled, walls, "finalizer")   # runs when the worker lets the result go
    return doubled


def fails(x):
    raise Loud()


def swaps_stdout(x):
    sys.stdout = Stream()
    return x + 1


def report():
    return list(seen)
'''


def test_learner_code_the_worker_reaches_after_a_call_runs_walled_in_and_recorded():
    """What the worker itself touches of a learner's objects runs as learner code: an attribute
    read (a property) under the call's operation limit; the message of a learner exception
    walled in with every operation refused; a finalizer of what a call left when the next
    learner block starts; a replaced ``sys.stdout`` is never flushed by the worker."""
    from autograder.boundary.causes import LearnerError, OperationRefused
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    learner = SandboxLearner([("leftovers", LEFTOVERS)], timeout=30)
    try:
        learner.begin(Exercise("leftovers", 1, forbid=("torch.softmax",)))
        lazy = learner.new("Lazy")
        learner.method(lazy, "append", torch.randn(3))
        with pytest.raises(OperationRefused, match=r"aten\._softmax"):
            learner.getattr(lazy, "total")
        with pytest.raises(LearnerError, match="your code raised Loud: loud") as failed:
            learner.call("fails", torch.randn(2))
        assert not isinstance(failed.value, OperationRefused)   # refused in the message: ignored
        learner.call("leaves", torch.randn(2))
        learner.call("swaps_stdout", torch.randn(2))
        seen = dict(learner.call("report"))
        assert seen == {"property": True, "exception message": True, "finalizer": True,
                        "operation in the message": "refused"}, seen
    finally:
        learner.close()
