"""Hostile submissions, graded through the CLI in a few batches: each attack scores 0 on its
exercise, leaves nothing behind, and the verdicts and results files are the grader's.

Batch ``hostile`` uses ``tests/fixtures/hostile_grader.py`` (one exercise per attack: the cell
returns ``a + b`` only if its attack worked). Batch ``chapters`` attacks the real ch01/ch02
graders. The attacks that need root (a user to drop to) are marked ``ROOT_ONLY``, those that need
the mount namespace ``NAMESPACES_ONLY``.
"""
import csv
import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from autograder.notebook import inject
from autograder.boundary.isolation import namespaces_available
from autograder.boundary.confine import landlock_abi

ROOT = Path(__file__).resolve().parents[2]
GRADER = ROOT / "tests/fixtures/hostile_grader.py"
IS_ROOT = os.geteuid() == 0
ISOLATED = namespaces_available() is None
ROOT_ONLY = pytest.mark.skipif(not IS_ROOT, reason="needs root: an unprivileged user to drop "
                               "to (CI runs as root)")
NAMESPACES_ONLY = pytest.mark.skipif(not ISOLATED, reason="needs namespaces (root with a "
                                     f"working unshare): {namespaces_available()}")
TOKEN = f"autograder-pwned-{os.getpid()}"
SECRET = f"s3cret-{os.getpid()}"
SITE = Path(site.getsitepackages()[0])
LEFTOVERS = [SITE / f"{TOKEN}.pth", Path("/var/tmp") / TOKEN, ROOT / f"{TOKEN}.txt"]
PROXY = f"\0{TOKEN}-proxy"   # an abstract Unix socket: a local process that could relay out


class LocalProxy:
    """Stand-ins for what a grading machine may hold within reach of a worker, during a batch:
    a local process listening on an abstract Unix socket (it answers ``pong``: a proxy that could
    relay to the network), and a listening TCP socket that the grader's own process inherits
    (``pass_fds``), as from a harness that leaves one open."""

    def __init__(self):
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(PROXY)
        self.unix.listen()
        self.inet = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.inet.bind(("127.0.0.1", 0))
        self.inet.listen()
        self.inet.set_inheritable(True)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.unix.accept()
            except OSError:
                return
            with conn:
                if conn.recv(4) == b"ping":
                    conn.sendall(b"pong")

    def close(self):
        self.unix.shutdown(socket.SHUT_RDWR)   # wakes the accept: the name is free for the next batch
        self.unix.close()
        self.inet.close()


def solution(grade_id, source):
    meta = {"nbgrader": {"solution": True, "grade": False, "locked": False,
                         "grade_id": grade_id, "schema_version": 3}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [],
            "execution_count": None}


def notebook(sources: dict) -> str:
    cells = [solution(name, source) for name, source in sources.items()]
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})


def attacks(out: Path, standin: Path) -> dict[str, str]:
    """grade_id -> solution cell; every cell but ``honest`` (and ``hang``, graded in a notebook
    of its own because it poisons the whole worker) misbehaves."""
    forge = json.dumps({"score": 100, "max_score": 1, "tests": []})
    return {
        "honest": "def honest(a, b):\n    print('adding')\n    return a + b",
        "loop": "def loop(a, b):\n    while True:\n        pass",
        "exit": "import os\ndef exit(a, b):\n    os._exit(0)",
        "import_reference": "from reference.model import build_tiny\n"
                            "def import_reference(a, b):\n    return a + b",
        "read_reference": f"SRC = open({str(ROOT / 'reference/kv_cache.py')!r}).read()\n"
                          "def read_reference(a, b):\n    return a + b",
        "patch_allclose": "torch.allclose = lambda *a, **k: True\n"
                          "torch.testing.assert_close = lambda *a, **k: None\n"
                          "def patch_allclose(a, b):\n    return a - b",
        "fake_score": "def fake_score(a, b):\n    print('All tests passed! Score: 10/10')\n"
                      "    return a * b",
        "write_results": f"for p in ['results.json', {str(out / 'hostile.json')!r}]:\n"
                         f"    try:\n        open(p, 'w').write({forge!r})\n"
                         "    except OSError:\n        pass\n"
                         "def write_results(a, b):\n    return 0",
        "allocate": "def allocate(a, b):\n    x = torch.empty(20 * 2**30, dtype=torch.uint8)\n"
                    "    return a + b",
        # any module, class or function of `reference` left in the learner's process
        "alias_reference": "import gc, types\ndef _from_reference(o):\n    try:\n"
                           "        name = o.__name__ if isinstance(o, types.ModuleType) "
                           "else o.__module__\n"
                           "        return str(name).startswith('reference')\n"
                           "    except Exception:\n        return False\n"
                           "found = [o for o in gc.get_objects() if isinstance(o, (type, "
                           "types.FunctionType, types.ModuleType)) and _from_reference(o)]\n"
                           "def alias_reference(a, b):\n    if not found:\n"
                           "        raise LookupError('no reference object here')\n"
                           "    return a + b",
        "kill_parent": "import os\ndef kill_parent(a, b):\n    os.kill(os.getppid(), 9)\n"
                       "    return a - b",
        # a socket on the Internet's families: closed by the network namespace (mode 1) or, where
        # none can be made, by the seccomp filter (mode 2)
        "network": "import socket\ndef network(a, b):\n    s = socket.socket(socket.AF_INET)\n"
                   "    s.bind(('127.0.0.1', 0))\n    s.close()\n    return a + b",
        # a local process on an abstract Unix socket (Unix sockets stay open to the worker):
        # closed by the network namespace, which has abstract names of its own (mode 1)
        "network_unix": "import socket\ndef network_unix(a, b):\n"
                        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                        f"    s.settimeout(2)\n    s.connect({PROXY!r})\n    s.sendall(b'ping')\n"
                        "    if s.recv(4) != b'pong':\n        raise ConnectionError('no answer')\n"
                        "    return a + b",
        # a network socket inherited from the grader's process, taken up without the socket call
        "network_inherited": "import os, socket\ndef network_inherited(a, b):\n"
                             "    for fd in range(3, 4096):\n        try:\n"
                             "            s = socket.socket(fileno=os.dup(fd))\n"
                             "        except OSError:\n            continue\n"
                             "        if s.family in (socket.AF_INET, socket.AF_INET6):\n"
                             "            return a + b\n        s.close()\n"
                             "    raise LookupError('no inherited network socket')",
        # the socket call by its x32 number (0x40000000 | 41), past a filter keyed on x86-64's
        "network_x32": "import ctypes, socket\ndef network_x32(a, b):\n"
                       "    libc = ctypes.CDLL(None, use_errno=True)\n"
                       "    fd = libc.syscall(0x40000000 | 41, socket.AF_INET, socket.SOCK_STREAM, 0)\n"
                       "    if fd < 0:\n        raise OSError(ctypes.get_errno(), 'x32 socket refused')\n"
                       "    return a + b",
        "write_site_packages": f"def write_site_packages(a, b):\n"
                               f"    open({str(LEFTOVERS[0])!r}, 'w').write('import os\\n')\n"
                               "    return a + b",
        "write_var_tmp": f"def write_var_tmp(a, b):\n    open({str(LEFTOVERS[1])!r}, 'w')"
                         ".write('x')\n    return a + b",
        "append_run_autograder": f"def append_run_autograder(a, b):\n"
                                 f"    open({str(standin)!r}, 'a').write('\\necho pwned\\n')\n"
                                 "    return a + b",
        "write_grader_cwd": f"def write_grader_cwd(a, b):\n    open({str(LEFTOVERS[2])!r}, "
                            "'w').write('x')\n    return a + b",
        "kill_grader": "import os\ndef kill_grader(a, b):\n    relay = os.getppid()\n"
                       "    status = open(f'/proc/{relay}/status').read()\n"
                       "    grader = int(status.split('PPid:')[1].split()[0])\n"
                       "    if grader <= 1:\n        raise RuntimeError('no grader in sight')\n"
                       "    os.kill(grader, 9)\n    return a + b",
        "fork_bomb": "import os, time\ndef fork_bomb(a, b):\n    for n in range(300):\n"
                     "        try:\n            pid = os.fork()\n        except OSError:\n"
                     "            raise RuntimeError(f'only {n} processes')\n"
                     "        if pid == 0:\n            time.sleep(120)\n            os._exit(0)\n"
                     "    return a + b",
        "environment": "import os\ndef environment(a, b):\n    print(dict(os.environ))\n"
                       f"    return a + b if {SECRET!r} in str(os.environ) else a - b",
        # routes to the worker's own objects (where the grader's records live) that need no
        # name a static look could see: each succeeds only if it reached the worker
        "frames": "import traceback\ndef frames(a, b):\n"
                  "    files = [f.f_code.co_filename for f, _ in traceback.walk_stack(None)]\n"
                  "    if not any('autograder' in name for name in files):\n"
                  "        raise LookupError('no worker frame')\n    return a + b",
        "traceback_frame": "def traceback_frame(a, b):\n    try:\n        1 / 0\n"
                           "    except ZeroDivisionError as e:\n"
                           "        frame = e.__traceback__.tb_frame\n"
                           "    while frame is not None and 'autograder' not in "
                           "frame.f_code.co_filename:\n        frame = frame.f_back\n"
                           "    if frame is None:\n        raise LookupError('no worker frame')\n"
                           "    return a + b",
        "gc_objects": "import gc\ndef gc_objects(a, b):\n"
                      "    if not any(type(o).__name__ == 'Worker' for o in gc.get_objects()):\n"
                      "        raise LookupError('no worker object')\n    return a + b",
        "worker_module": "import sys\ndef worker_module(a, b):\n"
                         "    if not hasattr(sys.modules['__main__'], 'Worker'):\n"
                         "        raise LookupError('no worker module')\n    return a + b",
        "ctypes_cast": "import ctypes\ndef ctypes_cast(a, b):\n"
                       "    ctypes.cast(id(a), ctypes.py_object).value\n    return a + b",
        "pickle_class": "import pickle\ndef pickle_class(a, b):\n"
                        "    pickle.loads(b'cbuiltins\\nlen\\n.')\n    return a + b",
    }


HANG = ("import fcntl, os, stat\n_kept = []\n"
        "for fd in range(3, 64):\n    try:\n"
        "        if not stat.S_ISFIFO(os.fstat(fd).st_mode):\n            continue\n"
        "        fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ\n"
        "        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:\n"
        "            _kept.append(os.dup(fd))   # the grader's pipe stays open, unread\n"
        "            r, w = os.pipe()\n            _kept.append(w)\n"
        "            os.dup2(r, fd)             # the worker waits on a pipe nobody writes\n"
        "    except OSError:\n        pass\n"
        "def hang(a, b):\n    return a + b")


def grade(folder: Path, out: Path, *extra: str, prefix=(), timeout=300, env=None, pass_fds=()):
    command = [*prefix, sys.executable, "-m", "autograder", "grade", str(folder), "--json",
               str(out), "--timeout", "3", "--seed", "7", *extra]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, AUTOGRADER_TEST_SECRET=SECRET, **(env or {})),
                          pass_fds=pass_fds)


def hostile_batch(tmp_path_factory, prefix=()):
    folder, out = tmp_path_factory.mktemp("subs"), tmp_path_factory.mktemp("out")
    # a root-owned stand-in for /autograder/run_autograder, outside the private /tmp
    standin = Path(tempfile.mkdtemp(prefix="run_autograder-", dir="/var/tmp")) / "run_autograder"
    standin.parent.chmod(0o755)
    standin.write_text("#!/bin/sh\necho grading\n")
    (folder / "hostile.ipynb").write_text(notebook(attacks(out, standin)))
    (folder / "invalid_json.ipynb").write_text('{"cells": [{"source": "def add(a, b):')
    proxy = LocalProxy()
    start = time.monotonic()
    try:
        run = grade(folder, out, "--tests", str(GRADER), "--csv", str(out / "grades.csv"),
                    "--jobs", "2", prefix=prefix, pass_fds=(proxy.inet.fileno(),))
    finally:
        proxy.close()
    seconds = time.monotonic() - start
    rows = {Path(r["submission"]).stem: r for r in csv.DictReader(open(out / "grades.csv"))} \
        if (out / "grades.csv").exists() else {}
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    left = [str(p) for p in LEFTOVERS if p.exists()]
    for path in LEFTOVERS:
        path.unlink(missing_ok=True)
    text = standin.read_text()
    shutil.rmtree(standin.parent)
    return dict(run=run, rows=rows, results=results, seconds=seconds, left=left, standin=text)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The hostile notebooks graded in the default mode."""
    return hostile_batch(tmp_path_factory)


def entry(results, name, submission="hostile"):
    return next(t for t in results[submission]["tests"] if t["name"].startswith(name + ":"))


NAMES = [n for n in attacks(Path("."), Path(".")) if n != "honest"]
NEED_ROOT = {"write_site_packages", "append_run_autograder", "write_grader_cwd", "kill_grader",
             "fork_bomb"}
NEED_NAMESPACES = {"read_reference", "write_var_tmp"}  # readable/writable by any user


def test_batch_completes_with_one_row_and_results_file_per_submission(batch):
    run, rows, results = batch["run"], batch["rows"], batch["results"]
    assert run.returncode == 0, run.stderr[-2000:]
    assert set(rows) == set(results) == {"hostile", "invalid_json"}
    assert "seed 7" in run.stdout and all(r["seed"] == "7" for r in rows.values())
    assert sum(t["max_score"] for t in results["hostile"]["tests"]) == len(NAMES) + 2  # + honest, hang


def test_honest_exercise_scores_full_and_its_output_is_shown(batch):
    rows, results = batch["rows"], batch["results"]
    assert rows["hostile"]["honest"] == "1" and entry(results, "honest")["status"] == "passed"
    assert "adding" in entry(results, "honest")["output"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=ROOT_ONLY) if n in NEED_ROOT else
                                  pytest.param(n, marks=NAMESPACES_ONLY) if n in NEED_NAMESPACES
                                  else n for n in NAMES])
def test_hostile_exercise_scores_zero(batch, name):
    assert batch["rows"]["hostile"][name] == "0"
    assert entry(batch["results"], name)["status"] == "failed"


@ROOT_ONLY
def test_write_attacks_were_tried_and_refused(batch):
    for name in ("write_site_packages", "append_run_autograder", "write_grader_cwd"):
        output = entry(batch["results"], name)["output"]
        # refused: not allowed, read-only, or not even visible (a repository under /tmp is
        # behind the sandbox's private /tmp)
        assert any(word in output for word in ("PermissionError", "Read-only file system",
                                               "No such file or directory")), output
    assert "PermissionError" in entry(batch["results"], "kill_grader")["output"] or \
        "no grader in sight" in entry(batch["results"], "kill_grader")["output"]
    # refused at the first fork (learner code may start no process); the sandbox user's process
    # limit stays behind it
    assert "a new process (os.fork)" in entry(batch["results"], "fork_bomb")["output"]


@ROOT_ONLY
def test_attacks_leave_nothing_behind(batch):
    assert batch["left"] == [] and batch["standin"] == "#!/bin/sh\necho grading\n"
    assert not any(TOKEN in p.name for p in Path.cwd().iterdir())


def test_totals_are_the_graders(batch):
    rows, results = batch["rows"], batch["results"]
    assert results["hostile"]["score"] == float(rows["hostile"]["total"])
    if ISOLATED:
        assert rows["hostile"]["total"] == "1" and results["hostile"]["score"] == 1
    assert rows["invalid_json"]["total"] == "0" and results["invalid_json"]["score"] == 0


def test_failures_are_explained(batch):
    rows, results = batch["rows"], batch["results"]
    assert "timed out after 3 s — an infinite loop?" in entry(results, "loop")["output"]
    assert "crashed" in entry(results, "exit")["output"]
    assert "code 0" in entry(results, "exit")["output"]
    assert "the grader forbids" in entry(results, "import_reference")["output"]
    assert "memory limit (4096 MB) exceeded" in entry(results, "allocate")["output"]
    assert "not valid notebook JSON" in rows["invalid_json"]["error"]
    assert "All tests passed" in entry(results, "fake_score")["output"]  # shown, not believed
    assert "gc.get_objects" in entry(results, "alias_reference")["output"]
    for name, event in (("frames", "sys._getframe"), ("traceback_frame", "object.__getattr__"),
                        ("gc_objects", "gc.get_objects"), ("ctypes_cast", "ctypes.cast"),
                        ("pickle_class", "pickle.find_class")):
        assert event in entry(results, name)["output"], (name, entry(results, name)["output"])
    assert "no worker module" in entry(results, "worker_module")["output"]


def test_the_worker_gets_an_allow_listed_environment(batch):
    assert SECRET not in json.dumps(batch["results"]) and SECRET not in batch["run"].stdout


@NAMESPACES_ONLY
def test_reference_files_are_unreadable_when_isolated(batch):
    results = batch["results"]
    assert "FileNotFoundError" in entry(results, "read_reference")["output"]
    assert "isolated" in results["hostile"]["output"]


def test_without_isolation_kill_parent_does_not_reach_the_grader(tmp_path):
    path = tmp_path / "kill_parent.ipynb"
    source = attacks(tmp_path, tmp_path)
    path.write_text(notebook({"kill_parent": source["kill_parent"], "honest": source["honest"]}))
    run = grade(path, tmp_path / "r.json", "--tests", str(GRADER), "--no-isolation")
    assert run.returncode == 0 and "NOT isolated" in run.stdout
    result = json.loads((tmp_path / "r.json").read_text())
    assert entry({"r": result}, "kill_parent", "r")["score"] == 0  # the relay died, not us
    assert entry({"r": result}, "honest", "r")["score"] == 1


# ------------------------------------------------ attacks on the real chapter graders (issue 6 §1)

CHAPTER_ATTACKS = {
    "ch01_naive_decoding": {
        "causal_attention": "def causal_attention(q, k, v):\n"
                            "    return F.scaled_dot_product_attention(q, k, v, is_causal=True)",
    },
    "ch02_kv_cache": {
        # a wrapper around any reference cache class found in the learner's process
        "KVCache": "import gc, sys\n"
                   "_Ref = getattr(sys.modules['__main__'], 'KVCache', None) or next(\n"
                   "    o for o in gc.get_objects() if isinstance(o, type)\n"
                   "    and getattr(o, '__module__', '').startswith('reference'))\n"
                   "class KVCache:\n    def __init__(self, *a, **k):\n"
                   "        object.__setattr__(self, '_c', _Ref(*a, **k))\n"
                   "    def __getattr__(self, name):\n        return getattr(self._c, name)",
        # the forbidden fused kernel, reached by a name no static look would find
        "decode_attention": "_fused = getattr(F, 'scaled_dot_' + 'product_attention')\n"
                            "def decode_attention(q, k, v):\n    return _fused(q, k, v)",
        # a naive loop through model.forward plus decoy calls shaped like the expected trace
        "cached_generate": "def cached_generate(model, prompt_ids, n_new, cache):\n"
                           "    seq, out = list(prompt_ids), []\n"
                           "    for _ in range(n_new):\n"
                           "        tok = int(model.forward(torch.tensor([seq]))[0, -1].argmax())\n"
                           "        out.append(tok)\n        seq.append(tok)\n"
                           "    decoy = model.new_cache(batch=1)\n"
                           "    model(torch.tensor([list(prompt_ids)]), cache=decoy)\n"
                           "    for _ in range(n_new - 1):\n"
                           "        model(torch.tensor([[0]]), cache=decoy)\n"
                           "    return out",
    },
}


@pytest.fixture(scope="module")
def chapter_batch(tmp_path_factory):
    folder, out = tmp_path_factory.mktemp("chapters"), tmp_path_factory.mktemp("chapters_out")
    for chapter, cells in CHAPTER_ATTACKS.items():
        nb = inject(ROOT / "exercises" / f"{chapter}.ipynb", cells)
        (folder / f"{chapter}.ipynb").write_text(json.dumps(nb))
    run = grade(folder, out)
    return run, {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.mark.parametrize("chapter, grade_id", [(c, g) for c, cells in CHAPTER_ATTACKS.items()
                                               for g in cells])
def test_chapter_attack_scores_zero(chapter_batch, chapter, grade_id):
    run, results = chapter_batch
    assert run.returncode == 0, run.stderr[-2000:]
    tests = [t for t in results[chapter]["tests"] if t["name"].startswith(grade_id + ":")]
    assert tests and all(t["score"] == 0 for t in tests), [t["output"] for t in tests]


def test_forbidden_function_is_named_in_the_report(chapter_batch):
    _, results = chapter_batch
    for chapter, grade_id in (("ch01_naive_decoding", "causal_attention"),
                              ("ch02_kv_cache", "decode_attention")):
        outputs = [t["output"] for t in results[chapter]["tests"]
                   if t["name"].startswith(grade_id + ":")]
        assert all("scaled_dot_product_attention" in o and "forbid" in o for o in outputs), outputs


# ------------------------------------------------------- sandbox modes, budget, signals (§2)

@ROOT_ONLY
def test_without_cap_sys_admin_the_unprivileged_user_sandbox_holds(tmp_path_factory):
    found = hostile_batch(tmp_path_factory, prefix=["setpriv", "--bounding-set=-sys_admin"])
    assert found["run"].returncode == 0, found["run"].stderr[-2000:]
    assert "unprivileged user" in found["results"]["hostile"]["output"]
    assert found["left"] == [] and found["standin"] == "#!/bin/sh\necho grading\n"
    rows = found["rows"]["hostile"]
    assert rows["honest"] == "1" and rows["network"] == "0"   # no network namespace: seccomp
    assert "no network sockets (seccomp)" in found["results"]["hostile"]["output"]
    if landlock_abi():  # writes and reads of the grader's files are refused by Landlock
        assert rows["total"] == "1"
    else:  # the reference sources stay readable, /var/tmp writable (and cleaned afterwards)
        assert rows["read_reference"] == rows["write_var_tmp"] == "1" and rows["total"] == "3"


@ROOT_ONLY
def test_as_root_without_any_sandbox_grading_is_refused(tmp_path):
    path, out = tmp_path / "honest.ipynb", tmp_path / "results.json"
    path.write_text(notebook({"honest": attacks(tmp_path, tmp_path)["honest"]}))
    out.write_text(json.dumps({"score": 10, "max_score": 10, "tests": []}))  # stale and forged
    run = grade(path, out, "--tests", str(GRADER),
                prefix=["setpriv", "--bounding-set=-sys_admin,-setuid,-setgid"])
    assert run.returncode != 0 and "refus" in run.stderr
    result = json.loads(out.read_text())
    assert result["score"] == 0 and "refus" in result["output"]


def test_a_worker_that_stops_reading_cannot_hang_the_grader(tmp_path):
    """F_SETPIPE_SZ + a sleeping reader: the grader's write of a 4 MB request has a deadline."""
    path, out = tmp_path / "hang.ipynb", tmp_path / "r.json"
    path.write_text(notebook({"hang": HANG}))
    start = time.monotonic()
    run = grade(path, out, "--tests", str(GRADER), "--budget", "4", timeout=120)
    assert run.returncode == 0 and time.monotonic() - start < 90, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["score"] == 0
    assert "timed out" in entry({"r": result}, "hang", "r")["output"] or \
        "time budget exhausted" in entry({"r": result}, "hang", "r")["output"]


def test_time_budget_fails_the_remaining_tests(tmp_path):
    path, out = tmp_path / "slow.ipynb", tmp_path / "r.json"
    source = attacks(tmp_path, tmp_path)
    honest = "def patch_allclose(a, b):\n    return a + b"  # graded after `loop`
    path.write_text(notebook({"loop": source["loop"], "patch_allclose": honest}))
    run = grade(path, out, "--tests", str(GRADER), "--budget", "4")
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert "time budget exhausted" in entry({"r": result}, "patch_allclose", "r")["output"]
    assert result["score"] == 0


def test_sigterm_to_the_grader_kills_the_sandbox(tmp_path):
    path, out = tmp_path / "loop.ipynb", tmp_path / "r.json"
    path.write_text(notebook({"loop": attacks(tmp_path, tmp_path)["loop"]}))
    out.write_text(json.dumps({"score": 1, "max_score": 1, "tests": []}))  # stale
    command = [sys.executable, "-m", "autograder", "grade", str(path), "--json", str(out),
               "--tests", str(GRADER), "--timeout", "60"]
    grader = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    descendants = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(descendants) < 2:
        time.sleep(0.5)
        descendants = _descendants(grader.pid)
    assert descendants, "the sandbox never started"
    time.sleep(2)
    descendants = _descendants(grader.pid)
    grader.send_signal(signal.SIGTERM)
    assert grader.wait(timeout=30) != 0
    time.sleep(1)
    alive = [p for p in descendants if Path(f"/proc/{p}").exists()
             and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[1][:3]]
    assert alive == []
    assert json.loads(out.read_text())["score"] == 0


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found
