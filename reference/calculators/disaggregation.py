"""Moving K/V instead of recomputing it: prefill-decode disaggregation and KV offload.

A disaggregated server (DistServe, Splitwise, Mooncake) prefills a prompt on one worker and
decodes it on another, so the prompt's K/V must cross a link between them. An offloading server
(Mooncake, LMCache) keeps K/V of earlier prompts in CPU memory or on SSD and loads it back
instead of recomputing the prefill. Both trade the same two numbers:

- the bytes of K/V a prompt of P tokens holds: `reference.calculators.memory`'s per-token size
  times P, and the time those bytes take over a link;
- the time to compute them again: a prefill of P tokens, 2 FLOPs per (active) weight per token
  plus causal attention, at a fraction ``mfu`` of the GPU's dense peak.

Per token, both grow alike (attention aside), so their ratio hardly depends on P: the
*break-even bandwidth* (K/V bytes over prefill seconds) says which links make moving cheaper than
computing. Servers stream K/V layer by layer while the prefill runs (Splitwise, DistServe,
Mooncake): only the part of the transfer that outlasts the prefill adds latency
(`exposed_transfer_seconds`). The same ratio is the rate at which a busy prefill GPU makes K/V,
so the links into a decode pool must carry that rate for every prefill GPU feeding it
(`kv_arrival_rate`).
"""
from __future__ import annotations

from dataclasses import dataclass

from reference.calculators.hardware import gpu as gpu_named
from reference.calculators.memory import kv_cache_bytes_for, model as model_named, whole_number


@dataclass(frozen=True)
class Link:
    """A path K/V can take, one direction, at its nominal rate (bytes/s)."""
    name: str
    bandwidth: float
    source: str


LINKS: dict[str, Link] = {l.name: l for l in (
    Link("NVLink 4", 450e9, "NVIDIA H100 data sheet: 900 GB/s of NVLink bandwidth per GPU, "
         "both directions together; 450 GB/s one way"),
    Link("PCIe 5.0 x16", 64e9, "PCI-SIG PCIe 5.0: 32 GT/s per lane, 16 lanes, about 63 GB/s "
         "one way after 128b/130b encoding (rounded to 64)"),
    Link("InfiniBand NDR", 50e9, "NVIDIA ConnectX-7 / Quantum-2 NDR: 400 Gb/s per port = 50 GB/s"),
    Link("Ethernet 100G", 12.5e9, "IEEE 802.3 100 Gb/s Ethernet = 12.5 GB/s"),
    Link("NVMe SSD", 7e9, "a PCIe 4.0 x4 NVMe SSD's sequential read, about 7 GB/s on current "
         "data sheets (e.g. Samsung 990 PRO: 7,450 MB/s)"),
)}


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


def link_bandwidth(link: str | float) -> float:
    """Bytes/s of a `LINKS` name, or the number itself (bytes/s)."""
    if isinstance(link, str):
        if link not in LINKS:
            raise ValueError(f"unknown link {link!r}; known: {', '.join(LINKS)}")
        return LINKS[link].bandwidth
    return _positive("link bandwidth", link)


def prefill_flops(model: str, tokens: int, active_params: float | None = None) -> float:
    """FLOPs of prefilling ``tokens`` tokens of preset ``model`` (one sequence).

    2 per active weight per token, plus causal attention: Q·Kᵀ and P·V, 4 * layers * q_heads *
    head_dim FLOPs per (query, visible key) pair, T(T+1)/2 pairs. ``active_params`` defaults to
    the preset's parameter count (give it for a mixture of experts, which uses a fraction).
    """
    m = model_named(model)
    tokens = int(_positive("tokens", tokens))
    params = m.params if active_params is None else _positive("active_params", active_params)
    pairs = tokens * (tokens + 1) // 2
    return 2 * params * tokens + 4 * m.layers * m.q_heads * m.head_dim * pairs


def prefill_seconds(model: str, tokens: int, gpu: str = "H100 SXM", mfu: float = 0.5,
                    active_params: float | None = None) -> float:
    """`prefill_flops` at ``mfu`` (the fraction of the GPU's dense fp16 peak a prefill reaches)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    return prefill_flops(model, tokens, active_params) / (gpu_named(gpu).fp16_flops * mfu)


def exposed_transfer_seconds(transfer_s: float, prefill_s: float, layers: int) -> float:
    """Latency a layer-by-layer transfer adds after a prefill of ``layers`` equal layers.

    Layer l's K/V leaves as soon as layer l is computed and the link is free. When a layer's
    share of the transfer is shorter than its compute, only the last layer's share is left
    (transfer_s / layers); otherwise the link is the bottleneck from the first layer on and
    the tail is transfer_s - prefill_s * (layers - 1) / layers.
    """
    layers = int(_positive("layers", layers))
    return max(transfer_s / layers, transfer_s - prefill_s * (layers - 1) / layers)


@dataclass(frozen=True)
class Handoff:
    """One prompt's K/V moved from a prefill worker to a decode worker (or loaded back)."""
    kv_bytes: int
    prefill_s: float
    transfer_s: float
    exposed_s: float

    @property
    def ratio(self) -> float:
        """transfer time / prefill time: below 1, moving is cheaper than computing again."""
        return self.transfer_s / self.prefill_s


def handoff(model: str, tokens: int, link: str | float, gpu: str = "H100 SXM",
            mfu: float = 0.5, dtype: str = "fp16", active_params: float | None = None) -> Handoff:
    """K/V bytes of a ``tokens``-token prompt, its prefill time, and its time over ``link``
    (whole, and the part left after a layer-by-layer overlap with the prefill)."""
    nbytes = kv_cache_bytes_for(model, tokens, dtype=dtype)
    prefill = prefill_seconds(model, tokens, gpu, mfu, active_params)
    transfer = nbytes / link_bandwidth(link)
    return Handoff(nbytes, prefill, transfer,
                   exposed_transfer_seconds(transfer, prefill, model_named(model).layers))


def breakeven_bandwidth(model: str, tokens: int, gpu: str = "H100 SXM", mfu: float = 0.5,
                        dtype: str = "fp16", active_params: float | None = None) -> float:
    """Bytes/s at which moving a prompt's K/V takes as long as prefilling it again."""
    return kv_cache_bytes_for(model, tokens, dtype=dtype) / prefill_seconds(
        model, tokens, gpu, mfu, active_params)


def kv_arrival_rate(model: str, tokens: int, prefill_gpus: int, gpu: str = "H100 SXM",
                    mfu: float = 0.5, dtype: str = "fp16",
                    active_params: float | None = None) -> float:
    """Bytes/s of K/V arriving at a decode pool fed by ``prefill_gpus`` GPUs that prefill
    ``tokens``-token prompts back to back.

    One busy prefill GPU makes a prompt's K/V bytes every prefill time: K/V bytes over prefill
    seconds, which is `breakeven_bandwidth`. Splitting a prefill over n GPUs (tensor
    parallelism) makes it n times shorter, so the rate is per GPU however they are grouped. A
    link that only just beats the break-even bandwidth keeps up with one prefill GPU; the links
    into a decode pool must carry the sum over every prefill GPU that feeds it.
    """
    gpus = whole_number("prefill_gpus", prefill_gpus, minimum=1)
    return gpus * breakeven_bandwidth(model, tokens, gpu, mfu, dtype, active_params)
