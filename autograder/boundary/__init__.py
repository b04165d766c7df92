"""The process boundary: learner code runs in a confined worker process; the grader talks to it
through pipes and keeps everything a verdict rests on.

Worker side (runs in the learner's process; imports only the standard library, torch, numpy,
triton and the other modules of this side or of the wire, never ``reference``, never
``autograder.rules`` or the front-ends: ``tests/grading/test_autograder_structure.py``):

- ``worker``     the request loop: runs the cells, calls the learner's functions and kernels
- ``confine``    namespaced mounts, the unprivileged user, Landlock (before learner code runs)
- ``guard``      forbidden functions made to raise while their exercise is graded
- ``proxies``    the learner's stand-ins for the grader's models and caches
- ``launching``  a Triton kernel launched on the grader's CPU tensors (interpreted or on a GPU)
- ``traffic``    an interpreted launch's loads and stores per tensor argument (read grader side
                 as ``LaunchTraffic``)
- ``audit``      the audit hook that keeps gc, frames, ctypes and pickled classes from learner
                 code (the run-time wall around what the worker records)
- ``exits``      the doors through which tensor data leaves torch (``np.asarray(t)``:
                 ``Tensor.__array__``; ``__dlpack__``, ``numpy``, ``tolist``), shut to learner
                 code under a limit
- ``causes``     a learner exception as the one-line cause a failed test shows
- ``compiling``  a kernel built for a T4, an A100 and an H100 without a GPU (the compile worker's
                 loop; ``reference/kernels/targets.py`` reads the targets and the build from it)

The wire (both sides): ``protocol`` (length-prefixed ``torch.save`` messages, read with
``weights_only``), ``refs`` (markers and handles, and the plain data they travel as).

Grader side (may import the wire and ``reference``; never ``autograder.rules``, which is
built on this package, nor a front-end; ``autograder.sandbox``'s ``SandboxLearner`` drives it):

- ``process``    one worker process: start, exchange a request under a deadline, kill
- ``budget``     the learner time a submission may spend over all its calls and restarts
- ``isolation``  which sandbox this machine allows, what the worker must see and not see
- ``store``      the reference models and caches that answer the proxies
- ``builds``     a submission's compile worker and the cache of its reports
"""

import sys

# autograder.boundary.sandbox has moved (autograder.MOVED). The parent package is loaded before
# this one; its helper is taken from sys.modules, not imported, so that no import cycle runs
# through autograder/__init__.py.
sys.modules["autograder"]._report_moved(__path__)
