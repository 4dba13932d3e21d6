"""Self-check of this machine for the kit: versions, numerics, training, data, collectives, speed and memory.

    python tools/gpu_check.py [--json gpu_check.json] [--only NAME,...] [--data-val val.rec] [-b 192]

Prints a verdict table (pass / warn / fail / not run) and writes the same as JSON. On a GPU machine it checks
what the kit's developers could not run (they have no GPU that MXNet 1.9.1 supports): the driver against DALI
2.4, MXNet's kernels for this GPU, float16 NHWC numerics against float32 on the CPU, float16 training with dynamic
loss scaling, the dali-gpu pipeline and the batch that reaches MXNet on the GPU, NCCL's allreduce, NVIDIA's fused
BatchNorm ops against the plain ones (its MXNet builds only), NCHW against NHWC step time at the batch you train with
(-b, runner's default) and whether that batch fits beside a stated margin for the data pipeline and the collectives,
each in a fresh process started before any GPU work here. It runs with the variables runner gives its workers (CUDA
graphs on, cuDNN autotune off, ...): the configuration training runs, but with an OpenMP thread per core for the
CPU checks. On a CPU machine every check with a CPU form runs and the GPU ones say "not run (no GPU)". A GPU
of compute capability 9.0 or newer (H100, H200) with an MXNet wheel from PyPI is named in one line before any
kernel runs. Exit status 1 when a check fails.
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from rn50kit.common import supported  # noqa: E402  (loads on the Pythons it refuses)

if __name__ == "__main__":
    supported.require_supported_python("gpu_check")  # NVIDIA's 3.8 containers: one line, not a traceback

from rn50kit.launch import devices  # noqa: E402  (no MXNet import: runner's variables are set before it)

NOT_RUN = "not run (no GPU)"
NOT_APPLICABLE = "not applicable"
NO_KERNELS = "not run (no MXNet kernels for this GPU)"
DALI_MIN_DRIVER = (525, 60)  # nvidia-dali-cuda120: CUDA 12 needs driver r525 or newer (NVIDIA's compatibility table)
# mxnet-cu112 1.9.1's sm_ list: MXNET_CUDA_ARCH "5.0;6.0;7.0;8.0;8.6" in apache/mxnet config/distribution/
# linux_cu112.cmake. A cubin for sm_XY also runs on sm_XZ with Z >= Y (same major): T4 (7.5), L4 (8.9) too.
MXNET_WHEEL_ARCHS = (50, 60, 70, 80, 86)
FORWARD_TOLERANCE = 2e-2  # float16 NHWC logits vs float32 NCHW: relative L2 error
BACKWARD_TOLERANCE = 5e-2  # the classifier's weight gradient: relative L2 error
PIXEL_TOLERANCE = 4.0  # mean absolute difference, in 0..255 pixel units (decoders and resize filters differ)


class Check:
    def __init__(self, name, what, run, gpu_only=False):
        self.name, self.what, self.run, self.gpu_only = name, what, run, gpu_only


class Machine:
    """What the checks need to know of this machine, found once."""

    def __init__(self):
        import mxnet as mx
        self.num_gpus = mx.context.num_gpus()
        self.gpu = self.num_gpus > 0
        self.workdir = tempfile.mkdtemp(prefix="rn50-gpu-check-")


def runner_plan(gpus, cores, environ):
    """(the variables runner sets, runner's default batch per GPU) for `runner -n <gpus>` on a machine of ``gpus``
    GPUs and ``cores`` cores (launcher.build_env, as runner plans it; values already in ``environ`` win)."""
    from rn50kit.launch import launcher
    # synthetic data: the variables do not depend on the data, and runner's plan would look for the data root
    args, extra = launcher.get_args_parser().parse_known_args(["-n", str(max(1, gpus)), "--data-backend",
                                                               "synthetic"])
    machine = launcher.Machine(gpus, cores)
    launcher.resolve_and_check(args, extra, machine)
    return launcher.build_env(args, machine, environ, extra), args.batch_size


def unsupported_gpu(machine):
    """The one line saying this GPU cannot run the installed MXNet and what to do, or None (runner refuses by the
    same test before it starts any worker)."""
    return devices.unsupported_gpu(machine.num_gpus if machine.gpu else 0)


# --- versions and capabilities --------------------------------------------------------------------------------

def library_version(names, symbol, decode):
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        value = ctypes.c_int()
        try:
            function = getattr(lib, symbol)
        except AttributeError:
            continue
        if symbol == "cudnnGetVersion":
            return decode(function())
        if function(ctypes.byref(value)) == 0:
            return decode(value.value)
    return None


def nvidia_smi():
    """[(name, driver version)] of the GPUs nvidia-smi lists, or []."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout
    return [tuple(part.strip() for part in line.split(",")) for line in out.splitlines() if line.strip()]


def check_versions(machine, args):
    import mxnet as mx
    import numpy
    found = {"python": sys.version.split()[0], "mxnet": mx.__version__, "numpy": numpy.__version__}
    try:
        import nvidia.dali
        found["dali"] = nvidia.dali.__version__
    except ImportError:
        found["dali"] = None
    try:
        import horovod
        found["horovod"] = horovod.__version__
    except ImportError:
        found["horovod"] = None
    features = [f.name for f in mx.runtime.Features().values() if f.enabled]
    found["mxnet_features"] = features
    problems = [name for name, want in (("mxnet", "1.9.1"), ("dali", "2.4"), ("horovod", "0.28.1"))
                if not (found[name] or "").startswith(want)]
    if tuple(int(x) for x in re.findall(r"\d+", numpy.__version__)[:2]) >= (1, 24):
        problems.append("numpy (MXNet 1.9.1 needs numpy<1.24)")
    detail = ", ".join(f"{k} {v}" for k, v in found.items() if k != "mxnet_features")
    detail += f"; MXNet built with {'CUDA, ' if 'CUDA' in features else ''}" \
              f"{'cuDNN, ' if 'CUDNN' in features else ''}{'NCCL, ' if 'NCCL' in features else ''}" \
              f"{'oneDNN' if 'MKLDNN' in features else 'no oneDNN'}"
    if problems:
        return "warn", f"not the pinned versions: {', '.join(problems)}; {detail}", found
    return "pass", detail, found


def check_driver(machine, args):
    gpus = nvidia_smi()
    found = {"gpus": gpus}
    found["cuda_runtime"] = library_version(["libcudart.so", "libcudart.so.11.0", "libcudart.so.12"],
                                            "cudaRuntimeGetVersion", lambda v: f"{v // 1000}.{v % 1000 // 10}")
    found["cudnn"] = library_version(["libcudnn.so", "libcudnn.so.8"], "cudnnGetVersion",
                                     lambda v: f"{v // 1000}.{v % 1000 // 100}.{v % 100}")
    found["nccl"] = library_version(["libnccl.so", "libnccl.so.2"], "ncclGetVersion",
                                    lambda v: f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000
                                    else f"{v // 1000}.{v % 1000 // 100}.{v % 100}")
    if not gpus:
        return "fail", "nvidia-smi lists no GPU while MXNet sees one", found
    driver = gpus[0][1]
    major_minor = tuple(int(x) for x in re.findall(r"\d+", driver)[:2])
    detail = (f"{len(gpus)} x {gpus[0][0]}, driver {driver}, CUDA runtime {found['cuda_runtime']}, "
              f"cuDNN {found['cudnn']}, NCCL {found['nccl']}")
    if major_minor < DALI_MIN_DRIVER:
        return "fail", (f"driver {driver} is older than r525, which DALI 2.4 (nvidia-dali-cuda120) needs; update "
                        f"the driver, or use --data-backend mxnet; {detail}"), found
    return "pass", detail, found


def wheel_covers(arch):
    """Whether the mxnet-cu112 wheel has a cubin that runs on compute capability ``arch`` (e.g. 75)."""
    return any(a // 10 == arch // 10 and a <= arch for a in MXNET_WHEEL_ARCHS)


def check_kernels(machine, args):
    """The GPU's architecture against the wheel's sm_ list, and a real float16 convolution on every GPU."""
    import mxnet as mx
    arch = devices.compute_capability(0)
    found = {"compute_capability": arch, "wheel_archs": list(MXNET_WHEEL_ARCHS)}
    for i in range(machine.num_gpus):
        try:
            x = mx.nd.ones((2, 16, 16, 4), ctx=mx.gpu(i), dtype="float16")
            w = mx.nd.ones((8, 3, 3, 4), ctx=mx.gpu(i), dtype="float16")
            mx.nd.Convolution(x, w, no_bias=True, kernel=(3, 3), num_filter=8, layout="NHWC").wait_to_read()
        except mx.base.MXNetError as error:
            return "fail", f"gpu({i}): {devices.describe_mxnet_error(error, machine.num_gpus)}", found
    if arch is None:
        return "pass", (f"a float16 NHWC convolution ran on all {machine.num_gpus} GPU(s); compute capability "
                        "unknown (the driver's libcuda.so.1 did not answer)"), found
    note = "" if wheel_covers(arch) else \
        f" (sm_{arch} has no cubin in the mxnet-cu112 wheel's list: this is another build, or it ran from PTX)"
    return "pass", f"sm_{arch}; a float16 NHWC convolution ran on all {machine.num_gpus} GPU(s){note}", found


def check_horovod_build(machine, args):
    from rn50kit.launch import launcher
    horovodrun = launcher.horovodrun_path()
    if horovodrun is None:
        return "fail", "horovodrun is not installed; run `make setup`", {}
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=300).stdout
    built = {m.group(2).strip(): m.group(1) == "X" for m in re.finditer(r"\[(X| )\]\s+(\S+)", out)}
    needed = ["MXNet", "Gloo"] + (["NCCL"] if machine.gpu else [])
    missing = [name for name in needed if not built.get(name)]
    detail = "built with " + ", ".join(name for name, on in built.items() if on)
    if missing:
        return "fail", (f"Horovod lacks {', '.join(missing)}; rebuild it: `make setup` (with the GPU MXNet "
                        f"installed, it builds with NCCL); {detail}"), built
    return "pass", detail, built


# --- numerics -------------------------------------------------------------------------------------------------

def resnet(layout="NCHW", channels=3, dtype="float32", ctx=None, classes=1000):
    import mxnet as mx
    import models
    net = models.get_model("resnet50_v1.5", num_classes=classes, layout=layout, input_layout=layout,
                           in_channels=channels, dtype=dtype)
    net.initialize(mx.init.Xavier(), ctx=ctx or mx.cpu())
    return net


def fixed_batch(batch=4, size=224, seed=0):
    import numpy as np
    rng = np.random.RandomState(seed)
    return rng.uniform(-2, 2, (batch, 3, size, size)).astype("float32"), rng.randint(0, 1000, batch)


def as_input(images, layout, channels):
    import numpy as np
    if channels == 4:
        images = np.concatenate([images, np.zeros_like(images[:, :1])], axis=1)
    return images.transpose(0, 2, 3, 1) if layout == "NHWC" else images


def forward_backward(net, images, labels, ctx, dtype):
    """(logits, gradient of the classifier's weight) of one training-mode forward and backward."""
    import mxnet as mx
    from mxnet import autograd, gluon
    x = mx.nd.array(images, ctx=ctx, dtype=dtype)
    y = mx.nd.array(labels, ctx=ctx)
    with autograd.record():
        logits = net(x).astype("float32")
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(logits, y)
    loss.backward()
    fc = [p for p in net.collect_params().values() if len(p.shape) == 2][-1]  # the classifier's weight
    return logits.asnumpy(), fc.grad(ctx).astype("float32").asnumpy()


def relative_error(a, b):
    import numpy as np
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def check_numerics_cpu(machine, args):
    """The float32 NCHW ResNet-50 (oneDNN) against a float64 reference with the same weights (MXNet's own
    non-oneDNN kernels), and against the same weights in the 4-channel structure (the conversion the GPU
    comparison relies on: models.load_parameters pads the stem): forward and one backward, on the CPU."""
    import mxnet as mx
    import models
    images, labels = fixed_batch(batch=2)
    net = resnet()
    net.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    path = os.path.join(machine.workdir, "reference.params")
    net.save_parameters(path)
    net.hybridize()
    logits, grad = forward_backward(net, images, labels, mx.cpu(), "float32")
    reference = resnet()
    reference.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    models.load_parameters(reference, path, mx.cpu())
    reference.cast("float64")
    ref_logits, ref_grad = forward_backward(reference, images, labels, mx.cpu(), "float64")
    padded = resnet(channels=4)
    padded.infer_shape(mx.nd.zeros((1, 4, 224, 224)))
    models.load_parameters(padded, path, mx.cpu())
    logits4, grad4 = forward_backward(padded, as_input(images, "NCHW", 4), labels, mx.cpu(), "float32")
    errors = {"float64_forward": relative_error(logits, ref_logits), "float64_backward": relative_error(grad, ref_grad),
              "4_channel_forward": relative_error(logits4, logits), "4_channel_backward": relative_error(grad4, grad)}
    tolerance = 1e-4
    ok = max(errors.values()) <= tolerance
    return ("pass" if ok else "fail"), (
        f"float32 ResNet-50 vs float64 reference: logits {errors['float64_forward']:.1e}, classifier gradient "
        f"{errors['float64_backward']:.1e}; 4-channel structure, same weights: {errors['4_channel_forward']:.1e}, "
        f"{errors['4_channel_backward']:.1e} (relative L2, tolerance {tolerance:g})"), dict(errors, tolerance=tolerance)


def check_numerics_gpu(machine, args):
    """float16 NHWC 4-channel ResNet-50 on gpu(0) against the float32 NCHW network with the same weights on the
    CPU: one training-mode forward and backward on a fixed batch."""
    import mxnet as mx
    import models
    images, labels = fixed_batch(batch=8)
    reference = resnet()
    reference.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    path = os.path.join(machine.workdir, "reference.params")
    reference.save_parameters(path)
    ref_logits, ref_grad = forward_backward(reference, images, labels, mx.cpu(), "float32")
    net = resnet(layout="NHWC", channels=4, dtype="float16", ctx=mx.gpu(0))
    net.infer_shape(mx.nd.zeros((1, 224, 224, 4), ctx=mx.gpu(0), dtype="float16"))
    models.load_parameters(net, path, mx.gpu(0))
    net.hybridize(static_alloc=True, static_shape=True)
    logits, grad = forward_backward(net, as_input(images, "NHWC", 4), labels, mx.gpu(0), "float16")
    forward, backward = relative_error(logits, ref_logits), relative_error(grad, ref_grad)
    found = {"forward_relative_error": forward, "backward_relative_error": backward,
             "forward_tolerance": FORWARD_TOLERANCE, "backward_tolerance": BACKWARD_TOLERANCE}
    ok = forward <= FORWARD_TOLERANCE and backward <= BACKWARD_TOLERANCE
    return ("pass" if ok else "fail"), (f"float16 NHWC 4-channel on the GPU vs float32 NCHW on the CPU: logits "
                                        f"{forward:.1e} (tolerance {FORWARD_TOLERANCE:g}), classifier gradient "
                                        f"{backward:.1e} (tolerance {BACKWARD_TOLERANCE:g}), relative L2"), found


# --- NVIDIA's fused BatchNorm ops -----------------------------------------------------------------------------

FUSED_FORWARD_TOLERANCE = 1e-2  # fused vs plain ops in the same precision: relative L2 error of the logits
FUSED_BACKWARD_TOLERANCE = 5e-2  # of each parameter's gradient (the worst one)


def fused_pair(machine, ctx, dtype, layout, channels, depth):
    """(plain, fused) ResNets of the kit with the same weights: the plain one initialised with every BatchNorm's
    gamma and beta drawn at random (the last gamma of a block is 0 at initialisation, which would hide the fused
    add), saved under the parameters' names and loaded into the fused one as a checkpoint is."""
    import mxnet as mx
    import models
    nets = [models.get_model(f"resnet{depth}_v1.5", num_classes=10, layout=layout, input_layout=layout,
                             in_channels=channels, dtype=dtype, fuse_bn_relu=fuse, fuse_bn_add_relu=fuse)
            for fuse in (False, True)]
    plain, fused = nets
    plain.initialize(mx.init.Xavier(), ctx=ctx)
    for name, param in plain.collect_params().items():
        if name.endswith(("_gamma", "_beta")):
            low, high = (0.5, 1.5) if name.endswith("_gamma") else (-0.2, 0.2)
            param.set_data(mx.nd.random.uniform(low, high, shape=param.shape, ctx=ctx, dtype=param.dtype))
    path = os.path.join(machine.workdir, f"fused-{depth}.params")
    mx.nd.save(path, {name: param.data(ctx) for name, param in plain.collect_params().items()})
    fused.initialize(ctx=ctx)
    models.load_parameters(fused, path, ctx)
    return plain, fused


def gradients(net, ctx):
    return {name: param.grad(ctx).astype("float32").asnumpy() for name, param in net.collect_params().items()
            if param.grad_req != "null"}


def step_time(net, x, y, steps):
    """Seconds per forward and backward pass (a training step without the update)."""
    import mxnet as mx
    from mxnet import autograd, gluon
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for i in range(steps + 1):
        if i == 1:  # the first pass builds the graph
            mx.nd.waitall()
            start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x).astype("float32"), y)
        loss.backward()
    mx.nd.waitall()
    return (time.perf_counter() - start) / steps


def compare_fused(machine, ctx, dtype, layout, channels, depth, size, batch, steps=10):
    """The network with this MXNet's fused BatchNorm+ReLU and BatchNorm+add+ReLU against the plain ops, same
    weights: training-mode logits and every parameter's gradient, and the time of a forward and backward pass."""
    import mxnet as mx
    import numpy as np
    plain, fused = fused_pair(machine, ctx, dtype, layout, channels, depth)
    rng = np.random.RandomState(0)
    images = as_input(rng.uniform(-2, 2, (batch, 3, size, size)).astype("float32"), layout, channels)
    labels = rng.randint(0, 10, batch)
    results = []
    for net in (plain, fused):
        net.hybridize(static_alloc=True, static_shape=True)
        logits, _ = forward_backward(net, images, labels, ctx, dtype)
        results.append((logits, gradients(net, ctx)))
    (plain_logits, plain_grads), (fused_logits, fused_grads) = results
    forward = relative_error(fused_logits, plain_logits)
    errors = {name: relative_error(fused_grads[name], grad) for name, grad in plain_grads.items()}
    worst = max(errors, key=errors.get)
    x, y = mx.nd.array(images, ctx=ctx, dtype=dtype), mx.nd.array(labels, ctx=ctx)
    plain_s, fused_s = step_time(plain, x, y, steps), step_time(fused, x, y, steps)
    found = {"forward_relative_error": forward, "worst_gradient": worst, "gradient_relative_error": errors[worst],
             "plain_step_s": plain_s, "fused_step_s": fused_s, "batch": batch,
             "forward_tolerance": FUSED_FORWARD_TOLERANCE, "backward_tolerance": FUSED_BACKWARD_TOLERANCE}
    ok = forward <= FUSED_FORWARD_TOLERANCE and errors[worst] <= FUSED_BACKWARD_TOLERANCE
    return ("pass" if ok else "fail"), (
        f"{dtype} {layout} ResNet-{depth}, fused vs plain BatchNorm ops, same weights: logits {forward:.1e} "
        f"(tolerance {FUSED_FORWARD_TOLERANCE:g}), worst gradient {errors[worst]:.1e} ({worst}; tolerance "
        f"{FUSED_BACKWARD_TOLERANCE:g}); forward+backward at batch {batch}: plain {plain_s * 1000:.0f} ms, fused "
        f"{fused_s * 1000:.0f} ms"), found


def check_fused_batchnorm(machine, args):
    """NVIDIA's fused BatchNorm+ReLU and BatchNorm+add+ReLU (its MXNet builds only), which float16 runs on GPUs use
    there by default, against the plain ops: float16 NHWC 4-channel ResNet-50 on gpu(0)."""
    import mxnet as mx
    if not devices.nvidia_fused_batchnorm():
        return NOT_APPLICABLE, ("this MXNet has no fused BatchNorm ops for GPUs (upstream's build): float16 runs "
                                "use the plain ones"), {}
    return compare_fused(machine, mx.gpu(0), "float16", "NHWC", 4, depth=50, size=224, batch=64)


# --- training -------------------------------------------------------------------------------------------------

def train_steps(ctx, dtype, layout, channels, size, layers, steps, batch, lr):
    """The kit's own step (fit.train_step, its trainer and loss scaler) on the synthetic backend's learnable
    data: (losses, applied flags, final loss scale)."""
    import mxnet as mx
    from mxnet import gluon
    from rn50kit.data import loaders
    import fit
    import models
    from rn50kit.training import optimizers
    from rn50kit.training.distributed import Distributed
    net = models.get_model(f"resnet{layers}_v1.5", num_classes=10, layout=layout, input_layout=layout,
                           in_channels=channels, dtype=dtype)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    iterator = loaders.SyntheticIterator(batch, (channels, size, size), 10, steps, ctx, dtype=dtype, layout=layout)
    trainer = optimizers.make_trainer(net, Distributed(None), None, "sgd", 5e-5, 0.9)
    trainer.set_learning_rate(lr)
    scaler = fit.make_loss_scaler(None, dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, applied = [], []
    for batch_data in iterator:
        loss, _, finite = fit.train_step(net, trainer, scaler, loss_fn, batch_data.data, batch_data.label, batch,
                                         scan_grads=dtype == "float16")
        losses.append(loss)
        applied.append(bool(finite))
    return losses, applied, scaler.scale


def falling(losses, window=5):
    import math
    finite = [x for x in losses if math.isfinite(x)]
    return len(finite) >= 2 * window and sum(finite[-window:]) / window < sum(finite[:window]) / window


def check_training_cpu(machine, args):
    import mxnet as mx
    losses, applied, _ = train_steps(mx.cpu(), "float32", "NCHW", 3, 32, 18, args.steps, 16, 0.1)
    found = {"losses": losses}
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    detail = f"{len(losses)} float32 ResNet-18 steps on synthetic data: loss {first:.3f} -> {last:.3f} (means of 5)"
    return ("pass" if falling(losses) and all(applied) else "fail"), detail, found


def check_training_gpu(machine, args):
    import mxnet as mx
    losses, applied, scale = train_steps(mx.gpu(0), "float16", "NHWC", 4, 224, 50, args.steps, 64, 0.1)
    overflows = applied.count(False)
    late = applied[len(applied) // 2:].count(False)
    found = {"losses": losses, "applied": applied, "final_scale": scale}
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    detail = (f"{len(losses)} float16 NHWC ResNet-50 steps (batch 64, dynamic loss scaling): loss {first:.3f} -> "
              f"{last:.3f}, {overflows} skipped for overflow ({late} in the second half), scale {scale:g}")
    ok = falling(losses) and late == 0 and overflows <= len(applied) // 4
    return ("pass" if ok else "fail"), detail, found


# --- data -----------------------------------------------------------------------------------------------------

def validation_records(machine, args):
    if args.data_val:
        idx = os.path.splitext(args.data_val)[0] + ".idx"
        return args.data_val, idx
    import bench_io
    prefix = os.path.join(machine.workdir, "photos")
    bench_io.make_photo_rec(prefix, 16)
    return prefix + ".rec", prefix + ".idx"


MEAN, STD = (123.68, 116.779, 103.939), (58.393, 57.12, 57.375)


def dali_batch(rec, idx, device, ctx, dtype="float32", layout="NCHW", channels=3, batch=8, normalize="auto"):
    """The first batch of the validation pipeline on ``device`` ("cpu"/"gpu"), through DaliBatches to ``ctx``
    (normalized where --dali-normalize ``normalize`` puts it, as data.py builds it), as float32 NCHW 3-channel
    numpy, with its labels."""
    import dali
    on_device = dali.normalizes_on_device(normalize, device, ctx)
    shape = (channels, 224, 224)
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=shape, mean=MEAN,
                             std=STD, dtype=dtype, layout=layout, device=device, resize_shorter=256, batch_size=batch,
                             num_threads=2, device_id=ctx.device_id if device == "gpu" else None, seed=1,
                             normalize=not on_device)
    pipe.build()
    after = dali.DeviceNormalize(shape, MEAN, STD, dtype, layout) if on_device else None
    images, labels = dali.DaliBatches(pipe, ctx, normalize=after).next()
    where = (str(images.context), str(images.dtype.__name__ if hasattr(images.dtype, "__name__") else images.dtype),
             images.shape)
    out = images.asnumpy().astype("float32")
    if layout == "NHWC":
        out = out.transpose(0, 3, 1, 2)
    return out[:, :3], labels.asnumpy(), where


def pixel_error(a, b):
    import numpy as np
    return float((np.abs(a - b) * np.array(STD, "float32")[None, :, None, None]).mean())


def opencv_reference(rec, idx, count):
    """The validation transform by OpenCV: shorter side to 256 (area filter), centre crop 224, normalize."""
    import cv2
    import numpy as np
    from mxnet import recordio
    reader = recordio.MXIndexedRecordIO(idx, rec, "r")
    out = []
    for i in sorted(reader.keys)[:count]:
        _, payload = recordio.unpack(reader.read_idx(i))
        rgb = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1].astype("float32")
        h, w = rgb.shape[:2]
        scale = 256 / min(h, w)
        nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)
        resized = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA)
        y0, x0 = (nh - 224 + 1) // 2, (nw - 224 + 1) // 2
        crop = (resized[y0:y0 + 224, x0:x0 + 224] - np.array(MEAN, "float32")) / np.array(STD, "float32")
        out.append(crop.transpose(2, 0, 1))
    reader.close()
    return np.stack(out)


def check_data_cpu(machine, args):
    import mxnet as mx
    rec, idx = validation_records(machine, args)
    images, _, where = dali_batch(rec, idx, "cpu", mx.cpu())
    error = pixel_error(images, opencv_reference(rec, idx, images.shape[0]))
    found = {"records": rec, "mean_abs_pixel_error": error, "tolerance": PIXEL_TOLERANCE, "batch": str(where)}
    return ("pass" if error <= PIXEL_TOLERANCE else "fail"), (
        f"dali-cpu validation batch vs OpenCV on {os.path.basename(rec)}: {error:.2f} (mean absolute, 0-255 units; "
        f"tolerance {PIXEL_TOLERANCE:g})"), found


def check_data_gpu(machine, args):
    """dali-gpu (nvJPEG), dali-cpu's uint8 crops normalized on the GPU (its default for a GPU) and dali-cpu
    normalized in the pipeline, staged through pinned memory, all into MXNet on gpu(0) as float16 NHWC 4-channel
    batches, against dali-cpu on the CPU."""
    import mxnet as mx
    rec, idx = validation_records(machine, args)
    reference, labels, _ = dali_batch(rec, idx, "cpu", mx.cpu())
    found, worst, parts = {"records": rec}, 0.0, []
    for name, device, normalize in [("dali-gpu", "gpu", "auto"), ("dali-cpu", "cpu", "auto"),
                                    ("dali-cpu --dali-normalize pipeline", "cpu", "pipeline")]:
        images, got_labels, where = dali_batch(rec, idx, device, mx.gpu(0), "float16", "NHWC", 4,
                                               normalize=normalize)
        error = pixel_error(images, reference)
        same_labels = bool((got_labels == labels).all())
        found[name] = {"mean_abs_pixel_error": error, "batch": str(where), "labels_equal": same_labels}
        worst = max(worst, error if same_labels else float("inf"))
        parts.append(f"{name} -> {where[0]} {where[1]} {tuple(where[2])}: {error:.2f}")
    summary = f"vs dali-cpu on the CPU (mean absolute, 0-255 units, tolerance {PIXEL_TOLERANCE:g}): " + "; ".join(parts)
    return ("pass" if worst <= PIXEL_TOLERANCE else "fail"), summary, found


# --- collectives ----------------------------------------------------------------------------------------------

def allreduce_worker():
    """Run by horovodrun: every rank contributes (rank+1) * ones; the sum must be exact."""
    import mxnet as mx
    import horovod.mxnet as hvd
    hvd.init()
    ctx = mx.gpu(hvd.local_rank()) if mx.context.num_gpus() else mx.cpu()
    size = 1 << 20
    tensor = mx.nd.ones((size,), ctx=ctx) * (hvd.rank() + 1)
    hvd.allreduce_(tensor, average=False, name="gpu_check")
    expected = hvd.size() * (hvd.size() + 1) / 2
    exact = bool((tensor == expected).sum().asscalar() == size)
    print("ALLREDUCE " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "ctx": str(ctx), "exact": exact}),
          flush=True)


def run_allreduce(workers):
    from rn50kit.launch import launcher
    horovodrun = launcher.horovodrun_path()
    if horovodrun is None:
        return "fail", "horovodrun is not installed; run `make setup`", {}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([horovodrun, "-np", str(workers), "-H", f"localhost:{workers}", "--gloo",
                             sys.executable, os.path.abspath(__file__), "--allreduce-worker"],
                            capture_output=True, text=True, timeout=600, env=env)
    reports = [json.loads(line.split("ALLREDUCE ", 1)[1]) for line in result.stdout.splitlines()
               if "ALLREDUCE " in line]
    found = {"reports": reports, "status": result.returncode}
    if result.returncode != 0 or len(reports) != workers:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return "fail", f"horovodrun -np {workers} exited with {result.returncode}: {tail[0]}", found
    exact = all(r["exact"] for r in reports)
    where = ", ".join(sorted({r["ctx"] for r in reports}))
    return ("pass" if exact else "fail"), (f"{workers} ranks ({where}) summed 1M floats "
                                           f"{'exactly' if exact else 'WRONGLY'}"), found


def check_allreduce_cpu(machine, args):
    return run_allreduce(2)


def check_allreduce_gpu(machine, args):
    if machine.num_gpus < 2:
        return NOT_APPLICABLE, "one GPU: no traffic between GPUs to check", {}
    return run_allreduce(machine.num_gpus)


# --- speed and memory -----------------------------------------------------------------------------------------

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
    from rn50kit.data import loaders
    import fit
    import models
    from rn50kit.training import optimizers
    from rn50kit.training.distributed import Distributed
    from mxnet import gluon
    ctx = mx.gpu(0)
    held = hold_memory(reserve, ctx)  # the margin for what a training run has beside the step
    net = models.get_model("resnet50_v1.5", num_classes=1000, layout=layout, input_layout=layout,
                           in_channels=channels, dtype="float16")
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    iterator = loaders.SyntheticIterator(batch, (channels, 224, 224), 1000, steps + warmup, ctx, dtype="float16",
                                         layout=layout, pool=1)
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
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--step-worker", spec],
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


CHECKS = [
    Check("versions", "MXNet, DALI, Horovod, numpy versions and MXNet's build features", check_versions),
    Check("driver", "NVIDIA driver (r525+ for DALI 2.4), CUDA runtime, cuDNN, NCCL", check_driver, gpu_only=True),
    # in fresh processes, before any GPU work in this one (MXNet's and DALI's pools keep what they take)
    Check("layout-speed", "float16 NCHW vs NHWC step time at -b", check_layout_speed, gpu_only=True),
    Check("memory", "-b fits (float16 NHWC ResNet-50, in a fresh process, a margin held for data and collectives)",
          check_memory, gpu_only=True),
    Check("kernels", "the GPU's architecture has MXNet kernels (a float16 NHWC convolution runs)", check_kernels,
          gpu_only=True),
    Check("horovod-build", "horovodrun --check-build: MXNet, Gloo (and NCCL with GPUs)", check_horovod_build),
    Check("numerics-cpu", "float32 ResNet-50 vs a float64 reference, and in the 4-channel structure",
          check_numerics_cpu),
    Check("numerics-gpu", "float16 NHWC 4-channel ResNet-50 on the GPU vs float32 NCHW on the CPU", check_numerics_gpu,
          gpu_only=True),
    Check("fused-batchnorm", "NVIDIA's fused BatchNorm+ReLU and +add+ReLU vs the plain ops (logits, gradients, "
          "time)", check_fused_batchnorm, gpu_only=True),
    Check("training-cpu", "float32 steps on synthetic data: the loss falls", check_training_cpu),
    Check("training-gpu", "float16 steps with dynamic loss scaling: loss falls, scale settles", check_training_gpu,
          gpu_only=True),
    Check("data-cpu", "dali-cpu validation batch vs OpenCV", check_data_cpu),
    Check("data-gpu", "dali-gpu and dali-cpu batches on the GPU vs dali-cpu on the CPU", check_data_gpu, gpu_only=True),
    Check("allreduce-cpu", "Horovod Gloo allreduce over 2 processes is exact", check_allreduce_cpu),
    Check("allreduce-gpu", "Horovod allreduce over every local GPU (NCCL) is exact", check_allreduce_gpu,
          gpu_only=True),
]


def run_checks(machine, args, checks=CHECKS, unsupported=None):
    """Each check's result; ``unsupported``: the line saying MXNet has no kernels for this GPU (unsupported_gpu),
    which the kernels check reports and for which no other GPU check runs."""
    results = []
    for check in checks:
        start = time.perf_counter()
        if check.gpu_only and not machine.gpu:
            verdict, detail, found = NOT_RUN, check.what, {}
        elif check.gpu_only and unsupported:
            verdict, detail, found = ("fail", unsupported, {}) if check.name == "kernels" else \
                (NO_KERNELS, check.what, {})
        else:
            try:
                verdict, detail, found = check.run(machine, args)
            except Exception as error:  # a check that breaks is a failed check, with its reason
                reason = devices.describe_mxnet_error(error, machine.num_gpus) \
                    if type(error).__name__ == "MXNetError" else f"{type(error).__name__}: {error}"
                verdict, detail, found = "fail", reason, {"traceback": traceback.format_exc()}
        results.append({"name": check.name, "what": check.what, "verdict": verdict, "detail": detail,
                        "seconds": round(time.perf_counter() - start, 2), "gpu_only": check.gpu_only, "data": found})
        print(f"  {check.name}: {verdict} ({results[-1]['seconds']:.1f} s)", file=sys.stderr, flush=True)
    return results


def table(results):
    width = max(len(r["name"]) for r in results)
    verdict_width = max(len(r["verdict"]) for r in results)
    lines = [f"{'check':<{width}}  {'verdict':<{verdict_width}}  detail", "-" * (width + verdict_width + 60)]
    lines += [f"{r['name']:<{width}}  {r['verdict']:<{verdict_width}}  {r['detail']}" for r in results]
    return "\n".join(lines)


def summary(results):
    counts = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return counts


def parse_args(argv):
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--json", default="gpu_check.json", help="where the JSON report goes")
    parser.add_argument("--only", help="comma-separated check names (default: all): " +
                        ", ".join(c.name for c in CHECKS))
    parser.add_argument("--data-val", help="validation RecordIO to compare the pipelines on (default: 16 photos "
                                           "built in a temporary folder)")
    parser.add_argument("-b", "--batch-size", type=int, default=None,
                        help="per-GPU batch you train with, for the layout timing and the memory check (default: "
                             "runner's, 192 on GPUs; -b 208 for the original's)")
    parser.add_argument("--steps", type=int, default=30, help="training steps of the training checks")
    parser.add_argument("--allreduce-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"-b must be at least 1, got {args.batch_size}")
    checks = CHECKS
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in {c.name for c in CHECKS}]
        if unknown:
            parser.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(c.name for c in CHECKS)}")
        checks = [c for c in CHECKS if c.name in names]
    return args, checks


def use_runners_environment(args):
    """Set the variables runner gives its workers on this machine (values already set win), before MXNet is
    imported: the checks run the configuration training runs. Returns them."""
    from rn50kit.common import cli
    from rn50kit.launch import launcher
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        env, default_batch = runner_plan(launcher.nvidia_gpu_count(), cores, os.environ)
    except cli.UsageError as error:
        cli.fail("gpu_check", f"runner cannot plan a run on this machine: {error}")
    # The CPU checks run in this one process alone: one OpenMP thread per core, not the 1 of runner's GPU workers
    # (the user's value wins, as with runner)
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(devices.openmp_threads()))
    os.environ.update(env)
    if args.batch_size is None:
        args.batch_size = default_batch
    return env


def main(argv=None):
    args, checks = parse_args(argv)
    if args.allreduce_worker:
        return allreduce_worker()
    if args.step_worker:
        return step_worker(args.step_worker)
    env = use_runners_environment(args)
    machine = Machine()
    print(f"gpu_check: {machine.num_gpus} GPU(s) visible to MXNet; running {len(checks)} check(s) with runner's "
          f"variables ({', '.join(f'{k}={v}' for k, v in sorted(env.items()))})", file=sys.stderr)
    unsupported = unsupported_gpu(machine)
    if unsupported:
        print(f"gpu_check: {unsupported}", file=sys.stderr, flush=True)
    results = run_checks(machine, args, checks, unsupported)
    counts = summary(results)
    print(table(results))
    verdict = "fail" if counts.get("fail") else "pass"
    report = {"verdict": verdict, "gpus": machine.num_gpus, "summary": counts, "checks": results,
              "environment": env, "batch_size": args.batch_size,
              "tolerances": {"forward": FORWARD_TOLERANCE, "backward": BACKWARD_TOLERANCE, "pixels": PIXEL_TOLERANCE}}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    shutil.rmtree(machine.workdir, ignore_errors=True)
    counted = ", ".join(f"{n} {v}" for v, n in counts.items())
    print(f"\n{verdict.upper()}: {counted}; JSON: {os.path.abspath(args.json)}")
    return 1 if verdict == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
