"""The learner kinds (autograder/learner.py): LocalLearner and check() in a notebook,
SandboxLearner's limits, stubs, memory-limited workers and kills, what the worker is shown, and
the grader-side store that answers the proxies and records every forward."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder.local import LocalLearner
from autograder.boundary.refs import Handle, ModelRef
from autograder.boundary.store import ReferenceStore


ROOT = Path(__file__).resolve().parents[2]


def test_local_learner_and_check_report_points(capsys):
    namespace = {}
    exec((ROOT / "tests/fixtures/add_solution.py").read_text(), namespace)
    learner = LocalLearner(namespace)
    counter = learner.new("Counter", 1)
    learner.method(counter, "bump")
    assert isinstance(counter, Handle) and learner.getattr(counter, "value") == 2
    sys.path.insert(0, str(ROOT / "tests/fixtures"))
    try:
        __import__("add_grader")
    finally:
        sys.path.remove(str(ROOT / "tests/fixtures"))
    from autograder import check

    def add(a, b):
        raise NotImplementedError()
    with pytest.raises(AssertionError, match="add: 2 of 2 tests fail(.|\n)*not implemented yet"):
        check(add)
    out = capsys.readouterr().out  # every line is printed before the error
    assert "✗ test_add_ints" in out and "✗ test_add_tensors" in out and "0/2 points" in out
    check(namespace["last_logits"])
    assert "1/1 points" in capsys.readouterr().out


def test_check_counts_a_skipped_test_as_a_failure(capsys):
    import pytest as _pytest
    from autograder.local import check
    from autograder.rules.plugin import REGISTRY, exercise

    @exercise("skipper_exercise", points=1)
    def test_skips(learner, seed):
        _pytest.skip("needs a GPU")

    def skipper_exercise():
        return None
    try:
        with pytest.raises(AssertionError, match="skipped: needs a GPU"):
            check(skipper_exercise, seed=0)
        assert "✗ test_skips" in capsys.readouterr().out
    finally:
        REGISTRY.pop("skipper_exercise")


def test_exercise_timeout_replaces_the_call_limit_and_forbid_is_enforced():
    from autograder.rules.plugin import Exercise
    from autograder.sandbox import SandboxLearner
    cells = [("spin", "import time\ndef spin():\n    time.sleep(30)"),
             ("fused", "def fused(q):\n    return F.scaled_dot_product_attention(q, q, q)")]
    learner = SandboxLearner(cells, timeout=30,
                             forbid=["torch.nn.functional.scaled_dot_product_attention"])
    try:
        learner.begin(Exercise("spin", 1, timeout=1))
        with pytest.raises(AssertionError, match="timed out after 1 s"):
            learner.call("spin")
        learner.begin(Exercise("fused", 1, forbid=(
            "torch.nn.functional.scaled_dot_product_attention",)))
        with pytest.raises(AssertionError, match="scaled_dot_product_attention` is forbidden"):
            learner.call("fused", torch.randn(1, 1, 2, 4))
        learner.begin(Exercise("fused", 1))  # allowed in another exercise
        assert learner.call("fused", torch.randn(1, 1, 2, 4)).shape == (1, 1, 2, 4)
    finally:
        learner.close()


def test_a_function_still_at_its_stub_fails_unrun_and_anything_else_runs():
    from autograder.sandbox import untouched_stub
    stub = 'def f(x):\n    """Doc."""\n    raise NotImplementedError("write f")\n'
    assert untouched_stub([("f", stub)], "f")
    assert untouched_stub([("f", "import torch\n\n\ndef f(x):\n    raise NotImplementedError\n")], "f")
    done = "def f(x):\n    return x\n"
    for cells in ([("f", done)],                                         # written
                  [("f", stub), ("g", "def g():\n    pass\nf = g\n")],  # bound again elsewhere
                  [("f", stub + "f = lambda x: x\n")],                  # bound again in its cell
                  [("f", "def f(x):\n    if x:\n        raise NotImplementedError\n    return 1\n")],
                  [("f", stub), ("f", done)],                            # graded twice
                  [("g", stub)]):                                        # not its exercise's cell
        assert not untouched_stub(cells, "f"), cells


def test_an_exercise_memory_limit_applies_while_it_is_graded():
    from autograder.rules.plugin import Exercise
    from autograder.sandbox import SandboxLearner
    cells = [("grab", "import torch\ndef grab(mb):\n    return float(torch.ones(mb * 2**18).sum())")]
    learner = SandboxLearner(cells, timeout=30, memory_mb=4096)
    try:
        learner.begin(Exercise("grab", 1))
        assert learner.memory_limit_mb == 4096 and learner.call("grab", 1200) == 1200 * 2**18
        learner.begin(Exercise("grab", 1, memory_mb=1024))
        assert learner.memory_limit_mb == 1024
        with pytest.raises(AssertionError, match=r"memory limit \(1024 MB\)"):
            learner.call("grab", 1200)
        learner.begin(Exercise("grab", 1))      # the next exercise gets the whole limit back
        assert learner.call("grab", 1200) == 1200 * 2**18
    finally:
        learner.close()


def test_an_honest_model_forward_loop_passes_cached_generate(capsys):
    from autograder.local import base_namespace, check
    from autograder.solutions import load_solutions
    source = load_solutions("ch02_kv_cache")["cached_generate"].replace("model(", "model.forward(")
    assert "model.forward(" in source
    namespace = base_namespace()
    exec(source, namespace)
    check(namespace["cached_generate"], seed=5)  # raises AssertionError if a test fails
    assert "all tests pass" in capsys.readouterr().out


def test_the_grader_side_store_refuses_bad_or_excessive_requests():
    store = ReferenceStore()
    model = store.register(ModelRef("tiny", 0))

    def ask(method, *args, target=model):
        return store.handle({"id": target.id, "method": method, "args": args, "kwargs": {}})
    assert ask("forward", torch.tensor([[1, 2]]))["ok"] and len(store.trace) == 1
    for bad in (torch.tensor([[1.5]]), torch.tensor([[999]]), torch.zeros(9, 1, dtype=torch.long)):
        assert not ask("forward", bad)["ok"]
    assert "no method" in ask("__class__")["error"] and "no method" in ask("state_dict")["error"]
    assert not ask("forward", torch.tensor([[1]]), None, {"__autograder__": "remote",
                                                          "kind": "model", "id": model.id})["ok"]
    replies = [ask("new_cache", 1, 4) for _ in range(300)]
    assert replies[0]["ok"] and "more than" in replies[-1]["error"]


def test_every_forward_is_recorded_with_its_model_whatever_cache_it_goes_into():
    store = ReferenceStore()
    target, draft = ModelRef("tiny", 0), ModelRef("tiny", 0, role="draft")
    remotes = [store.register(m) for m in (target, draft)]
    assert remotes[0].id != remotes[1].id == store.model_id(draft)
    made = store.handle({"id": remotes[0].id, "method": "new_cache", "args": (1, 8), "kwargs": {}})
    cache = {"__autograder__": "remote", "kind": "cache", "id": made["value"]["id"]}
    for remote, kwargs in ((remotes[0], {"cache": cache}), (remotes[1], {})):
        assert store.handle({"id": remote.id, "method": "forward", "args": (torch.tensor([[1, 2]]),),
                             "kwargs": kwargs})["ok"]
    assert [(f.model, f.cache) for f in store.trace] == [(store.model_id(target), cache["id"]),
                                                         (store.model_id(draft), None)]


def test_what_the_worker_is_shown_and_what_is_masked(tmp_path):
    """The allow-list: masking ``readable_cover(shown)`` leaves exactly the shown folders (and
    the folders on the way to them) readable; ``readable`` carves a hidden folder out of a
    shown one, for Landlock's read rules."""
    from autograder.boundary.confine import readable, readable_cover
    for path in ("home/a/venv/lib", "home/a/course/autograder/solutions", "home/b", "srv/x",
                 "usr/lib"):
        (tmp_path / path).mkdir(parents=True)
    (tmp_path / "home/a/secret.txt").write_text("token")
    shown = [str(tmp_path / "home/a/venv"), str(tmp_path / "usr")]
    masked = set(readable_cover(shown, str(tmp_path)))
    assert masked == {str(tmp_path / p) for p in ("home/a/course", "home/a/secret.txt", "home/b",
                                                  "srv")}
    carved = set(readable([str(tmp_path / "home/a")], [str(tmp_path / "home/a/course")]))
    assert carved == {str(tmp_path / "home/a/venv"), str(tmp_path / "home/a/secret.txt")}
    assert readable([str(tmp_path / "srv")], []) == [str(tmp_path / "srv")]


def test_the_worker_is_shown_python_and_the_system_only():
    from autograder.boundary.isolation import import_dirs, shown_dirs
    shown = shown_dirs(import_dirs(exclude=[]))
    assert "/usr" in shown and not any(d in shown for d in ("/", "/root", "/home", "/tmp", "/work"))
    assert all(not (a != b and b.startswith(a + "/")) for a in shown for b in shown)


def test_the_next_memory_limit_s_worker_is_started_ahead_as_another_user():
    """With exercises under two memory limits, the second limit's worker starts while the first
    serves its exercises (as the other sandbox user, so that killing the first one's user leaves
    it running), and serves the limited exercise from its first call; none is started for an
    exercise still at its stub."""
    from autograder.sandbox import SandboxLearner
    from autograder.rules.plugin import Exercise
    free, limited = Exercise("free", 1), Exercise("capped", 1, memory_mb=1536)
    cells = [("free", "def free(x):\n    return x + 1\n"),
             ("capped", "def capped(x):\n    return x * 2\n")]
    learner = SandboxLearner(cells, timeout=30)
    try:
        learner.start([free, limited])
        first, ahead = learner.worker, learner._standby
        assert ahead is not None and ahead.memory_mb == 1536 and ahead.running
        if first.uid is not None:
            assert ahead.uid != first.uid
        learner.begin(free)
        assert float(learner.call("free", torch.tensor(1.0))) == 2.0
        learner.begin(limited)
        assert float(learner.call("capped", torch.tensor(3.0))) == 6.0
        assert learner.worker is ahead and not first.running and learner._standby is None
    finally:
        learner.close()
    stub = [("free", cells[0][1]), ("capped", "def capped(x):\n    raise NotImplementedError\n")]
    learner = SandboxLearner(stub, timeout=30)
    try:
        learner.start([free, limited])
        assert learner._standby is None
    finally:
        learner.close()


def test_a_forked_worker_holds_only_its_pipes_and_a_dead_fork_server_is_replaced():
    """Workers are forked by a fork server (autograder/boundary/forkserver.py) that runs as the
    grader's user and sees the whole machine: a worker holds none of its files (through its
    socket, learner code could have workers forked as it likes) and nothing of its working
    directory is on the worker's sys.path. A fork server that died is replaced at the next
    worker."""
    from autograder.boundary.process import ForkServer
    from autograder.sandbox import SandboxLearner
    cells = [("look", "import os, sys\n"
                      "def look():\n"
                      "    kinds = []\n"
                      "    for name in os.listdir('/proc/self/fd'):\n"
                      "        try:\n"
                      "            kinds.append(os.readlink('/proc/self/fd/' + name).split(':')[0])\n"
                      "        except OSError:\n"
                      "            pass   # the listing's own descriptor, closed by now\n"
                      "    return sorted(kinds), list(sys.path)\n")]
    for attempt in range(2):
        learner = SandboxLearner(cells, timeout=30)
        try:
            learner.start()
            kinds, path = learner.call("look")
        finally:
            learner.close()
        assert "socket" not in kinds and kinds.count("pipe") == 2 and len(kinds) == 5, kinds
        assert not any("autograder-forkserver" in p for p in path), path
        for server in ForkServer._servers.values():   # the next attempt finds it dead
            server.proc.kill()
            server.proc.wait()


def test_a_fork_server_that_cannot_start_is_reported_with_what_it_printed(monkeypatch, tmp_path):
    """An environment in which the fork server cannot import the worker (here a planted
    ``autograder`` package first on its path): grading is refused with what the server printed."""
    from autograder.boundary import process
    from autograder.boundary.process import EnvironmentProblem
    from autograder.sandbox import SandboxLearner
    (tmp_path / "autograder").mkdir()
    (tmp_path / "autograder" / "__init__.py").write_text("raise ImportError('planted')\n")
    broken = dict(process.worker_environment([], cuda=False), PYTHONPATH=str(tmp_path))
    monkeypatch.setattr(process, "worker_environment", lambda *args, **kwargs: broken)
    learner = SandboxLearner([("look", "def look():\n    return 1\n")], timeout=30)
    try:
        with pytest.raises(EnvironmentProblem, match="(?s)fork server exited.*planted"):
            learner.call("look")
    finally:
        learner.close()


def test_a_worker_killed_from_two_threads_at_once_is_killed_once(tmp_path):
    """Closing a sandbox kills the compile worker while a build may be killing it too (a build
    thread runs beside the tests): every call returns, none fails, and a build whose pipe was
    closed under it is told the worker was stopped."""
    import os
    import threading
    from autograder.boundary.process import WorkerProcess
    worker = WorkerProcess("none", None, tmp_path, tmp_path / "log.txt", [])
    worker.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    worker._read, worker._write = os.pipe()
    start, errors = threading.Barrier(8), []

    def kill():
        start.wait()
        try:
            worker.kill()
        except Exception as exc:  # noqa: BLE001 - what the race used to raise
            errors.append(exc)
    threads = [threading.Thread(target=kill) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and worker.proc is None and not worker.running
    assert "stopped by the grader" in str(worker._crashed("while building"))



def test_a_path_gone_before_the_worker_masks_it_is_skipped_and_any_other_failure_raises():
    """Another grading's worker directory, listed beside a Python environment under /tmp, may be
    deleted before this worker masks it (two graders at once): nothing is left to hide, so the
    worker starts; any other failed mount still stops it."""
    import ctypes
    import errno

    from autograder.boundary import confine
    ctypes.set_errno(errno.ENOENT)
    confine._mask(-1, "mount tmpfs over /tmp/autograder-worker-gone")
    ctypes.set_errno(errno.EPERM)
    with pytest.raises(PermissionError, match="mount tmpfs over /tmp/x"):
        confine._mask(-1, "mount tmpfs over /tmp/x")
    confine._mask(0, "a mount that worked")
