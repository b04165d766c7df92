"""reference.calculators.hardware: the GPU table's derived rates agree with the figures the
papers and data sheets print."""
import pytest

from reference.calculators.hardware import GPUS


def test_clock_reproduces_the_dense_tensor_peak():
    # A100: 108 SMs x 4 tensor cores x 256 fp16 FMA per clock; Hopper: 132 x 4 x 512
    for name, fma_per_sm in (("A100 80GB", 4 * 256), ("H100 SXM", 4 * 512), ("H200", 4 * 512)):
        g = GPUS[name]
        assert 2 * fma_per_sm * g.sms * g.clock_hz == pytest.approx(g.fp16_flops, rel=0.002), \
            f"{name}: the clock should be the one behind the data sheet's dense fp16 peak"


def test_exponentials_are_far_slower_than_matmul_flops():
    a100, h100 = GPUS["A100 80GB"], GPUS["H100 SXM"]
    # FlashAttention-3 (section 3.1): "3.9 TFLOPS of special functions" on an H100 SXM5
    assert h100.exp_rate == pytest.approx(3.9e12, rel=0.01)
    assert h100.fp16_flops / h100.exp_rate == pytest.approx(256, rel=0.01)
    # on an A100 an exponential costs the time of ~128 matmul FLOPs, an FP32 FLOP ~16
    assert a100.fp16_flops / a100.exp_rate == pytest.approx(128, rel=0.01)
    assert a100.fp16_flops / a100.fp32_flops == pytest.approx(16, rel=0.01)
    assert GPUS["B200"].exp_rate is None, "no clock in the table: no rate, rather than a guess"
