"""precision: bfloat16 and float16 in process: the CPU checks, the overflow check's dtype rule and the dynamic loss
scale."""
import mxnet as mx
import pytest
from model_workers.timing import bfloat16_missing

from rn50kit.config import settings
from rn50kit.training import precision
from support.networks import NO_BFLOAT16


def test_cpu_checks_agree(tmp_path):
    """bench_models' check (its PyTorch worker has no MXNet) is train.py's rule, against the flags each sample
    lacks."""
    samples = {"fpu sse2 avx avx2 fma": "avx512f, avx512bw, avx512vl, avx512dq",
               "avx2 avx512f avx512bw avx512vl": "avx512dq", "avx2 avx512f avx512dq avx512bw avx512vl": None,
               "avx512f avx512dq avx512bw avx512vl avx512_bf16 amx_bf16": None, "": None}  # "": flags unreadable
    for number, (flags, missing) in enumerate(samples.items()):
        path = tmp_path / f"cpuinfo{number}"
        path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n" if flags else "processor\t: 0\n")
        ours, train_py = bfloat16_missing(str(path)), settings.bfloat16_unsupported(str(path))
        if missing is None:
            assert ours is None and train_py is None, flags
        else:
            assert f"AVX-512 (oneDNN's bfloat16 kernels) and this one lacks {missing};" in ours, ours
            assert ours == train_py  # one rule (rules.bfloat16_problem), one wording
    assert (bfloat16_missing() is None) == (NO_BFLOAT16 is None)


def test_dynamic_scale_grows_after_clean_steps():
    scaler = precision.LossScaler(8.0, dynamic=True, growth_interval=3)
    for _ in range(3):
        scaler.update(True)
    assert scaler.scale == 16.0
    static = precision.LossScaler(1.0)
    static.update(False)
    assert static.scale == 1.0 and static.bad_steps == 1


def test_one_multi_all_finite_call_refuses_mixed_dtypes():
    """The library fact the grouping is for (MXNet takes the element type from the first input)."""
    with pytest.raises(mx.base.MXNetError, match="data type do not match"):
        mx.nd.multi_all_finite(mx.nd.ones(3, dtype="float16"), mx.nd.ones(3), num_arrays=2).asscalar()
