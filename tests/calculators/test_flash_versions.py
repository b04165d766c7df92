"""reference.calculators.flash_versions.pick_flash: the version rule of chapter 07 on every GPU of its table."""
import pytest

from reference.calculators.flash_versions import GPU_GENERATIONS, HEAD_DIMS, pick_flash

EXPECTED_BY_GENERATION = {"Pascal": 0, "Volta": 0, "Ampere": 2, "Ada": 2, "Hopper": 3, "Blackwell": 4}


@pytest.mark.parametrize("gpu", sorted(GPU_GENERATIONS))
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_every_gpu_gets_its_generations_version_and_a_reason_naming_it(gpu, training, head_dim):
    generation = GPU_GENERATIONS[gpu]
    choice = pick_flash(gpu, training, head_dim)
    if generation == "Turing":
        expected = 0 if training and head_dim > 64 else 1
    else:
        expected = EXPECTED_BY_GENERATION[generation]
    assert choice.version == expected
    assert generation in choice.reason


def test_names_are_case_insensitive_and_the_default_head_dim_is_64():
    assert pick_flash("h100", True) == pick_flash("H100", True, 64)
    assert pick_flash(" t4 ", True).version == 1


def test_training_matters_only_where_a_backward_pass_is_missing():
    differs = {gpu for gpu in GPU_GENERATIONS for d in HEAD_DIMS
               if pick_flash(gpu, True, d).version != pick_flash(gpu, False, d).version}
    assert differs == {"T4", "RTX 2080"}


@pytest.mark.parametrize("args, error, message", [
    (("TPU v5", False), ValueError, "unknown GPU"),
    (("", True), ValueError, "unknown GPU"),
    ((None, True), ValueError, "unknown GPU"),
    (("A100", "yes"), TypeError, "training"),
    (("A100", False, 100), ValueError, "head_dim"),
    (("A100", False, 256), ValueError, "head_dim"),
    (("A100", False, 0), ValueError, "head_dim"),
    (("A100", False, True), ValueError, "head_dim"),
])
def test_bad_input_gets_a_one_line_error(args, error, message):
    with pytest.raises(error, match=message):
        pick_flash(*args)
