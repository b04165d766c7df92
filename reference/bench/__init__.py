"""Measurements: everything that times the course's code, and the numbers the book prints.

Nothing in the core (`reference.model`, `reference.engine`, `reference.kernels`, ...) imports
from here. Each benchmark runs side by side in one process, so its ratios are meaningful:

    python -m reference.bench decode ...       decode.py    naive / cached / HF generate, floor, batched, under load
    python -m reference.bench passes ...       passes.py    a pass over T positions vs the roofline
    python -m reference.bench batch ...        batch.py     the engine vs HF generate_batch and HF sequential
    python -m reference.bench serve ...        serve.py     static vs continuous batching under a workload
    python -m reference.bench speculative ...  speculative.py  drafters vs plain decoding vs HF prompt lookup
    python -m reference.bench engine-host ...  host.py      an engine step's host time beside its model time
    python -m reference.bench kernels ...      kernels.py   the Triton kernels vs PyTorch (results/ holds GPU tables)
    python -m reference.bench threads ...      threads.py   OpenMP wait policies and thread choice, quiet and under load

The toolkit they share is `measure.py` (one timer, one bandwidth, one provenance record);
`machine.py` measures this machine's roofline (chapter 04), `workload.py` builds the chat
workloads, `hf_peer.py` loads transformers on the same weights, `composition.py` runs chapter
11's ladder, `prose.py` words the book's sentences from the measured data,
`flash_figures.py` draws chapters 05 and 07's figures from numbers the chapters compute, and
`compiler_tables.py` lays out chapters 05-08's compiler verdicts (shared memory, registers,
spills per GPU, read from `reference.kernels.chapter_builds`) within the page's 80 columns.
"""
