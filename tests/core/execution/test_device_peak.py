"""Model FLOPs use only where the device's peak FLOP/s is known: never a made-up figure."""

from siirl.execution.device import format_mfu, model_flops_use, peak_tflops


def test_known_gpus_have_a_peak_others_none():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 67.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops("cpu") is None and peak_tflops("NVIDIA GeForce RTX 3050") is None


def test_mfu_is_a_fraction_or_not_available():
    assert model_flops_use(6.7e12, "NVIDIA H100 80GB HBM3") == 0.1
    assert model_flops_use(6.7e12, "cpu") is None
    assert format_mfu(0.1, "NVIDIA H100") == "10.00%"
    assert format_mfu(None, "cpu") == "n/a (no known peak FLOP/s for cpu)"
    assert "nan" not in format_mfu(model_flops_use(1e9, "cpu"), "cpu")
