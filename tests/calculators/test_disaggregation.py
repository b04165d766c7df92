"""reference.calculators.disaggregation: bytes, times and the break-even bandwidth by hand."""
from __future__ import annotations

import pytest

from reference.calculators import disaggregation as dg
from reference.calculators.hardware import GPUS


def test_prefill_flops_weights_plus_causal_attention():
    # Llama 3.1 8B: 32 layers, 32 query heads of 128; 8.03e9 parameters
    flops = dg.prefill_flops("Llama 3.1 8B", 4)
    assert flops == 2 * 8.03e9 * 4 + 4 * 32 * 32 * 128 * (1 + 2 + 3 + 4)
    assert dg.prefill_flops("Llama 3.1 8B", 4, active_params=1e9) == 2e9 * 4 + 4 * 32 * 32 * 128 * 10


def test_prefill_seconds_at_a_fraction_of_the_peak():
    seconds = dg.prefill_seconds("Llama 3.1 8B", 1000, "H100 SXM", mfu=0.5)
    assert seconds == pytest.approx(dg.prefill_flops("Llama 3.1 8B", 1000) / (989.4e12 * 0.5))
    with pytest.raises(ValueError, match="mfu"):
        dg.prefill_seconds("Llama 3.1 8B", 1000, mfu=0)


def test_handoff_of_an_8b_prompt_over_infiniband():
    h = dg.handoff("Llama 3.1 8B", 4096, "InfiniBand NDR")
    assert h.kv_bytes == 2 * 32 * 8 * 128 * 2 * 4096          # 512 MiB in fp16
    assert h.transfer_s == pytest.approx(h.kv_bytes / 50e9)
    assert h.ratio == pytest.approx(h.transfer_s / h.prefill_s)
    assert h.exposed_s == pytest.approx(h.transfer_s / 32)    # the link keeps up with the layers


def test_exposed_transfer_in_both_regimes():
    # the link keeps up: only the last layer's share is left
    assert dg.exposed_transfer_seconds(1.0, 4.0, 4) == pytest.approx(0.25)
    # the link is the bottleneck: it runs from the end of layer 1 to the end
    assert dg.exposed_transfer_seconds(8.0, 4.0, 4) == pytest.approx(8.0 - 3.0)
    assert dg.exposed_transfer_seconds(4.0, 4.0, 1) == pytest.approx(4.0)


def test_breakeven_bandwidth_is_bytes_over_prefill_time():
    bw = dg.breakeven_bandwidth("SmolLM2-135M", 2048)
    h = dg.handoff("SmolLM2-135M", 2048, bw)
    assert h.transfer_s == pytest.approx(h.prefill_s)
    # a small model makes far more K/V per FLOP than a large one
    assert bw > 20 * dg.breakeven_bandwidth("Llama 3.1 70B", 2048)


def test_a_decode_pool_receives_the_kv_of_every_prefill_gpu_feeding_it():
    h = dg.handoff("Llama 3.1 8B", 4096, "InfiniBand NDR")
    one = dg.kv_arrival_rate("Llama 3.1 8B", 4096, prefill_gpus=1)
    assert one == pytest.approx(h.kv_bytes / h.prefill_s), \
        "one busy prefill GPU makes a prompt's K/V bytes every prefill time"
    assert one == pytest.approx(dg.breakeven_bandwidth("Llama 3.1 8B", 4096))
    sixteen = dg.kv_arrival_rate("Llama 3.1 8B", 4096, prefill_gpus=16)
    assert sixteen == pytest.approx(16 * one)
    # a link fast enough for one prompt's handoff is not fast enough for many prefill GPUs
    assert one < dg.link_bandwidth("InfiniBand NDR") < sixteen
    for bad in (0, 1.5):
        with pytest.raises((ValueError, TypeError), match="prefill_gpus"):
            dg.kv_arrival_rate("Llama 3.1 8B", 4096, prefill_gpus=bad)


def test_links_and_errors():
    assert dg.link_bandwidth("Ethernet 100G") == 12.5e9
    assert dg.link_bandwidth(3e9) == 3e9
    assert all(link.source for link in dg.LINKS.values())
    with pytest.raises(ValueError, match="unknown link"):
        dg.link_bandwidth("carrier pigeon")
    with pytest.raises(ValueError, match="tokens"):
        dg.handoff("Llama 3.1 8B", 0, "NVLink 4")
    assert "H100 SXM" in GPUS
