"""What a grader applies, in the grader's (trusted) process: the ``exercise`` mark, the pytest
plugin and its points (``plugin``), assertions that teach (``feedback``), fresh inputs
(``inputs``), the static look at a cell's source (``forbid``, ``kernel_rules``).

May import ``autograder.boundary``'s wire and grader side (never its worker side's internals)
and ``reference``; the chapter graders in ``autograder/tests/`` import from here.
"""
