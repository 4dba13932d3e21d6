"""Speed and memory on the GPU: NCHW against NHWC step time at the batch you train with, and whether that batch
fits beside a margin for the data pipeline and the collectives, each in a fresh process."""
import json
import os
import subprocess
import sys
import time

from rn50kit.hardware import devices
from selfcheck import GPU_CHECK

# What the memory check holds back on the GPU for the parts of a training run its step leaves out: the dali-gpu
# training pipeline's device buffers (nvJPEG's, the decoded images' and the crops', DALI's default pool) and
# NCCL's (its channels' buffers and communicators), as estimates, and Horovod's fusion buffer at the size runner
# sets (HOROVOD_FUSION_THRESHOLD; Horovod's own default is 128 MiB). About 1.2 GiB with runner's 64 MiB.
MIB = 1 << 20


PIPELINE_MARGIN = {"the dali-gpu pipeline's buffers": 768 * MIB, "NCCL's buffers": 384 * MIB}


HOROVOD_DEFAULT_FUSION = 128 * MIB


def memory_margin(environ):
    """{part: bytes} the memory check holds on the GPU beside the training step (see PIPELINE_MARGIN)."""
    fusion = int(environ.get("HOROVOD_FUSION_THRESHOLD", HOROVOD_DEFAULT_FUSION))
    return dict(PIPELINE_MARGIN, **{"Horovod's fusion buffer": fusion})


def hold_memory(nbytes, ctx):
    """An array of ``nbytes`` bytes on ``ctx``, written so it is allocated (held by the caller), or None."""
    import mxnet as mx
    if not nbytes:
        return None
    held = mx.nd.zeros((nbytes,), ctx=ctx, dtype="uint8")
    held.wait_to_read()
    return held


def release_gpu_memory(machine):
    """Give back what MXNet's and DALI's pools hold of this process's freed GPU memory (their pooled allocators
    keep it otherwise: MXNet's src/storage/pooled_storage_manager.h), before a check starts a process that needs
    the GPU's memory. Neither starts CUDA on a GPU this process has not used: MXNet refuses to empty a pool it
    never made ("Cannot Free space to a device you have not allocated", src/storage/storage.cc, ReleaseAll: skipped
    here), and DALI releases only the pools it made (dali/core/mm/default_resources.cc, ReleaseUnusedMemory)."""
    import mxnet as mx
    mx.nd.waitall()
    for ordinal in range(machine.num_gpus):
        try:
            mx.gpu(ordinal).empty_cache()
        except mx.base.MXNetError as error:
            if "have not allocated" not in str(error):
                raise
    try:
        from nvidia.dali import backend
    except ImportError:
        return
    backend.ReleaseUnusedMemory()


def step_seconds(layout, channels, batch, steps=10, warmup=3, reserve=0):
    import mxnet as mx
    from mxnet import gluon

    import fit
    import models
    from rn50kit.data import backend_synthetic
    from rn50kit.training import optimizers
    from rn50kit.training.distributed import Distributed
    ctx = mx.gpu(0)
    held = hold_memory(reserve, ctx)  # the margin for what a training run has beside the step
    net = models.get_model("resnet50_v1.5", num_classes=1000, layout=layout, input_layout=layout,
                           in_channels=channels, dtype="float16")
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    iterator = backend_synthetic.SyntheticIterator(batch, (channels, 224, 224), 1000, steps + warmup, ctx,
                                                   dtype="float16", layout=layout, pool=1)
    trainer = optimizers.make_trainer(net, Distributed(None), None, "sgd", 5e-5, 0.9)
    trainer.set_learning_rate(0.01)
    scaler = fit.make_loss_scaler(None, "float16")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    start = None
    for i, batch_data in enumerate(iterator):
        if i == warmup:
            mx.nd.waitall()
            start = time.perf_counter()
        fit.train_step(net, trainer, scaler, loss_fn, batch_data.data, batch_data.label, batch)
    mx.nd.waitall()
    del held
    return (time.perf_counter() - start) / steps


def step_worker(spec):
    """Run by measure_step in a fresh process: one timing, printed as a STEP line."""
    import mxnet as mx
    layout, channels, batch, steps, warmup, reserve = json.loads(spec)
    try:
        result = {"seconds": step_seconds(layout, channels, batch, steps, warmup, reserve)}
    except mx.base.MXNetError as error:
        result = {"error": devices.describe_mxnet_error(error, mx.context.num_gpus())}
    print("STEP " + json.dumps(result), flush=True)


def measure_step(layout, channels, batch, steps=10, warmup=3, reserve=0):
    """Seconds per float16 ResNet-50 training step on GPU 0, in a fresh process (with this process's environment,
    runner's), ``reserve`` bytes held on the GPU beside it. (seconds or None, error line)."""
    spec = json.dumps([layout, channels, batch, steps, warmup, reserve])
    result = subprocess.run([sys.executable, GPU_CHECK, "--step-worker", spec],
                            capture_output=True, text=True, timeout=1800)
    lines = [line for line in result.stdout.splitlines() if line.startswith("STEP ")]
    if not lines:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"the timing process exited with {result.returncode}: {tail[0]}"
    report = json.loads(lines[-1][len("STEP "):])
    return report.get("seconds"), report.get("error")


def check_layout_speed(machine, args):
    """Both layouts at the user's batch, each in a fresh process. With 4 input channels both: `--conv-layout NCHW`
    (the advice) keeps the float16 default's zero 4th channel (devices.float16_gpu_defaults)."""
    batch = args.batch_size
    release_gpu_memory(machine)
    (nchw, nchw_error), (nhwc, nhwc_error) = measure_step("NCHW", 4, batch), measure_step("NHWC", 4, batch)
    found = {"nchw_step_s": nchw, "nhwc_step_s": nhwc, "batch": batch}
    if nchw_error or nhwc_error:
        return "fail", f"-b {batch}: NCHW {nchw_error or 'ran'}; NHWC {nhwc_error or 'ran'}", found
    detail = (f"float16 ResNet-50 step at batch {batch}, 4 channels: NCHW {nchw * 1000:.0f} ms, "
              f"NHWC {nhwc * 1000:.0f} ms")
    if nhwc > 1.1 * nchw:
        return "warn", (detail + "; NHWC (the default) is slower on this GPU: train with --conv-layout NCHW "
                                 f"(e.g. `./runner -n 8 -b {batch} --conv-layout NCHW`)"), found
    return "pass", detail + "; the NHWC default is right here", found


def check_memory(machine, args):
    import mxnet as mx
    margin = memory_margin(os.environ)
    reserve = sum(margin.values())
    held = (f"{reserve / 2 ** 30:.2f} GiB held back for " +
            ", ".join(f"{part} ({size // MIB} MiB)" for part, size in margin.items()))
    release_gpu_memory(machine)
    seconds, error = measure_step("NHWC", 4, args.batch_size, steps=2, warmup=1, reserve=reserve)
    found = {"batch": args.batch_size, "margin_bytes": margin}
    if error:
        return "fail", f"-b {args.batch_size} does not fit with {held}: {error}", found
    free, total = mx.context.gpu_memory_info(0)
    found.update(step_s=seconds, gpu_total_bytes=total)
    return "pass", (f"-b {args.batch_size} fits with {held} (float16 NHWC ResNet-50 training step in a fresh "
                    f"process, {args.batch_size / seconds:.0f} img/s on one GPU; {total / 2 ** 30:.0f} GiB)"), found
