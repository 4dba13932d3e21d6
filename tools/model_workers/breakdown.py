"""Where a training step's time goes: a worker runs steps under oneDNN's verbose log between two marks, and the
time of every kernel it ran is summed by kind; what is not a matrix product is overhead."""
import time

from model_workers.mxnet_steps import SEED, fresh_network, mxnet_training, synthetic_batch

MATRIX_PRODUCT_KERNELS = ("convolution", "inner_product", "matmul")  # oneDNN's primitive kinds
OVERHEAD_TARGET = 0.20  # of the step: what the issue tracker aims the non-matrix-product time at
BREAKDOWN_MARKS = ("bench_models: breakdown starts", "bench_models: breakdown ends")


def breakdown_worker(precision, model, batch_size, image_size, steps, fuse_bn_relu=False):
    """In a process started with DNNL_VERBOSE=1: warm up, then run ``steps`` training steps between two marks on
    stdout, so the driver can sum the kernels oneDNN logged for those steps alone."""
    if precision == "bfloat16":
        from mxnet.contrib import amp
        amp.init(target_dtype="bfloat16")
    import mxnet as mx
    mx.random.seed(SEED)
    step = mxnet_training(mx, fresh_network(mx, model, precision, fuse_bn_relu),
                          *synthetic_batch(mx, batch_size, image_size))
    for _ in range(2):  # graph building, oneDNN's primitive caches, the optimizer's state
        step()
    print(BREAKDOWN_MARKS[0], flush=True)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    print(f"{BREAKDOWN_MARKS[1]} after {1000 * (time.perf_counter() - start):.3f} ms", flush=True)


def kernel_times(verbose_log):
    """({oneDNN primitive kind: total ms}, the steps' wall time in ms) of the 'dnnl_verbose,exec,...' lines between
    the breakdown marks (the last field of such a line is the kernel's time in ms; the end mark has the wall time)."""
    totals, inside = {}, False
    for line in verbose_log.splitlines():
        if line.startswith(BREAKDOWN_MARKS[0]):
            inside = True
        elif line.startswith(BREAKDOWN_MARKS[1]):
            return totals, float(line.split()[-2])
        elif inside and line.startswith(("dnnl_verbose,exec,", "onednn_verbose,exec,")):
            fields = line.split(",")
            totals[fields[3]] = totals.get(fields[3], 0.0) + float(fields[-1])
    return totals, None


def step_breakdown(kernels_ms, steps, wall_ms):
    """Per step: each kernel kind's ms, the matrix products' share of the step (``wall_ms`` over ``steps``, in the
    same process: the kernels ran inside it), and the rest as overhead (including what ran outside oneDNN)."""
    step_ms = wall_ms / steps
    per_step = {kind: total / steps for kind, total in kernels_ms.items()}
    products = sum(per_step.get(kind, 0.0) for kind in MATRIX_PRODUCT_KERNELS)
    outside = step_ms - sum(per_step.values())
    return {"step_ms": step_ms, "kernels_ms": per_step, "matrix_products_ms": products,
            "outside_onednn_ms": outside, "matrix_product_share": products / step_ms,
            "overhead_share": 1 - products / step_ms}


def print_breakdown(key, breakdown, steps, timed_ms):
    b = breakdown
    print(f"breakdown: {key}: {b['step_ms']:.1f} ms a step over {steps} steps with oneDNN's verbose log "
          f"({timed_ms:.1f} ms in the timed rounds):")
    rows = sorted(b["kernels_ms"].items(), key=lambda kv: -kv[1])
    rows.append(("outside oneDNN (optimizer update, MXNet's own ops, Python, engine)", b["outside_onednn_ms"]))
    for kind, ms in rows:
        tag = " (matrix products)" if kind in MATRIX_PRODUCT_KERNELS else ""
        print(f"  {kind + tag:<72}{ms:9.1f} ms {100 * ms / b['step_ms']:6.1f} %")
    print(f"breakdown: {key}: matrix products {100 * b['matrix_product_share']:.1f} % of the step, overhead "
          f"{100 * b['overhead_share']:.1f} % (target below {100 * OVERHEAD_TARGET:.0f} %)")
