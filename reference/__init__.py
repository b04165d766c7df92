"""The course's reference implementation.

Imported before torch, it asks OpenMP to let idle threads sleep rather than spin
(OMP_WAIT_POLICY=PASSIVE unless set): decoding then degrades gently instead of collapsing when
another process takes a core. Why, and what it costs: reference/threads.py.
"""
from reference.threads import passive_wait

passive_wait()
