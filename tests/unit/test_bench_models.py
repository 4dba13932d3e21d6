"""tools/bench_models.py in process: bfloat16 operands, the ceiling's notes and the oneDNN kernel breakdown of the
marked steps (its workers as processes: e2e/test_bench_models_workers.py)."""
import bench_models
import mxnet as mx
import numpy as np
import pytest
from model_workers import mxnet_steps
from model_workers.breakdown import BREAKDOWN_MARKS, kernel_times, step_breakdown

from support.networks import NO_BFLOAT16


def test_a_share_above_the_ceiling_is_explained():
    # a ResNet-50 at 224 px: 8.2 GFLOP an image forward (4.1 G multiply-adds), about three times that a step
    ceilings = {"float32": 100.0, "bfloat16": 400.0}
    rates = {"ours float32 training step": 5.0, "ours bfloat16 inference": 40.0}  # 1.23 and 0.82 of 100 / 400
    results = {key: {"ceiling_fraction": bench_models.fraction(key, ips, ceilings, "resnet50_v1.5", 224)}
               for key, ips in rates.items()}
    assert results["ours float32 training step"]["ceiling_fraction"] > 1 > results["ours bfloat16 inference"][
        "ceiling_fraction"]
    note = bench_models.above_ceiling_note(results)
    assert note.startswith("note: ours float32 training step above 100 %") and "bfloat16" not in note
    del results["ours float32 training step"]
    assert bench_models.above_ceiling_note(results) is None


def test_bench_models_bfloat16_operands_and_matrix_product():
    """The ceiling's matrix product: its operands cast to MXNet's bfloat16 on any CPU (the cast that failed on an
    AVX-512 machine: dtype="bfloat16" is no NumPy dtype); the product itself needs oneDNN's bfloat16 kernel."""
    with pytest.raises(TypeError, match="bfloat16"):  # why bench_models casts with mxnet_bfloat16()
        mx.nd.amp_cast(mx.nd.ones((2, 2)), dtype="bfloat16")
    mx.random.seed(3)
    low = mxnet_steps.mxnet_matrix_products(mx, "bfloat16", size=64)["bfloat16"]
    mx.random.seed(3)
    full = mxnet_steps.mxnet_matrix_products(mx, "float32", size=64)["float32"]
    for x, reference in zip(low.operands, full.operands):
        assert x.dtype == mxnet_steps.mxnet_bfloat16() and mxnet_steps.dtype_name(x.dtype) == "bfloat16"
        back = mx.nd.amp_cast(x, dtype="float32").asnumpy()
        error = np.abs(back - reference.asnumpy()).max()
        assert 0 < error <= 2 ** -8  # bfloat16 keeps 8 bits of mantissa; |values| < 1
    expected = full().asnumpy()
    if NO_BFLOAT16:
        with pytest.raises(mx.base.MXNetError, match="primitive descriptor"):
            low().wait_to_read()
        return
    got = mx.nd.amp_cast(low(), dtype="float32").asnumpy()
    error = np.abs(got - expected).max() / np.abs(expected).max()
    assert 0 < error < 0.02, error


def test_bench_models_sums_onednn_kernels_of_the_marked_steps_only():
    log = "\n".join([
        "dnnl_verbose,info,oneDNN v2.4.4",
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32,,alg:convolution_direct,mb2_ic3oc64,9.0",
        BREAKDOWN_MARKS[0],
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32,,alg:convolution_direct,mb2_ic3oc64,2.5",
        "dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 dst_f32,,,64x3x7x7,0.25",
        "a line of the network's own output",
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,backward_data,src_f32,,alg:convolution_direct,mb2_ic3oc64,1.5",
        BREAKDOWN_MARKS[1] + " after 20.000 ms",
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32,,alg:convolution_direct,mb2,7.0"])
    totals, wall_ms = kernel_times(log)
    assert totals == {"convolution": 4.0, "reorder": 0.25} and wall_ms == 20.0
    breakdown = step_breakdown(totals, steps=2, wall_ms=wall_ms)
    assert breakdown["step_ms"] == 10.0
    assert breakdown["kernels_ms"] == {"convolution": 2.0, "reorder": 0.125}
    assert breakdown["matrix_product_share"] == pytest.approx(0.2) and breakdown["overhead_share"] == pytest.approx(0.8)
    assert breakdown["outside_onednn_ms"] == pytest.approx(10.0 - 2.125)


def test_a_ratio_with_a_side_never_steady_says_so():
    """A variant whose warm-up hit --max-warmup unsettled flags every ratio it is in (issue 44)."""
    results = {"ours float32 training step": {"median": 6.0, "settled": True},
               "PyTorch float32 training step": {"median": 5.0, "settled": False},
               "ours float32 inference": {"median": 24.0, "settled": True},
               "PyTorch float32 inference": {"median": 20.0, "settled": True}}
    ratio = bench_models.ratios(results)
    lines = bench_models.ratio_lines(ratio, results)
    assert lines[0].startswith("ours float32 training step / PyTorch float32 training step")
    assert lines[0].endswith("1.20x  (NOT steady: PyTorch float32 training step)")
    assert lines[1].endswith("1.20x")
