"""The chapters' calculators: closed-form models a reader can check with pen and paper.

    memory.py          bytes of the KV cache for any model, precision and batch; the one
                       table of bits per dtype (chapter 03)
    hardware.py        the GPU data-sheet table (chapters 03, 04, 07)
    roofline.py        traffic, arithmetic intensity, the roofline, a forward's cost, a decode
                       step kernel by kernel (chapter 04)
    flash_traffic.py   HBM bytes of plain attention and of FlashAttention 1's and 2's
                       loop orders (chapter 05)
    flash_versions.py  which FlashAttention version runs on which GPU (chapter 07)
    fa3_schedule.py    FlashAttention-3's softmax/GEMM overlap as a toy schedule (chapter 07)
    contiguous.py      a contiguous reserve-max_len allocator, paging's foil (chapter 08)
    fragmentation.py   contiguous vs paged pools replayed on one workload (chapter 08)
    batching_sim.py    static, continuous and chunked-prefill schedules, simulated (chapter 09)
"""
