"""What a grader applies, in the grader's (trusted) process: the ``exercise`` mark, the pytest
plugin and its points (``plugin``), assertions that teach (``feedback``), fresh inputs
(``inputs``), the static look at a cell's source (``forbid``, ``kernel_rules``).

May import ``autograder.boundary`` (which never imports this package: the direction is one-way)
and ``reference``; never a front-end nor the learner classes built on both (``autograder.learner``,
``sandbox``, ``local``). The chapter graders in ``autograder/graders/`` import from here.
"""
