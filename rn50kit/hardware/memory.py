"""How much memory a configuration needs, estimated before anything runs, and the batch that fits.

Training keeps, per worker: the parameters with their gradients and optimizer state (float16 adds float32 master
weights), and every layer's output for the backward pass (activations: layer by layer from the network's graph,
times the batch, times the bytes of the dtype), plus the framework's own memory. The same estimate serves a CPU
(its available memory shared by the workers of the machine) and a GPU (its memory).

Calibrated on MXNet 1.9.1's CPU build: the peak resident memory of train.py (synthetic data, float32, 224 px)
grew by 106 MB per image for ResNet-50 (its layer outputs: 150 MB per image) and 35 MB for ResNet-18 (33 MB),
from about 0.6 GiB besides the parameters. ACTIVATION_FACTOR (outputs kept, less what the memory planner shares,
plus the gradients of the activations) lies between the two: the estimate is ResNet-50's peak +20 %, ResNet-18's
-20 %; it says whether a batch is far too large, not the last image that fits. For ResNet-50 it gives
float16 batch 208 on a 16 GB V100 (about 13 GiB) and float32 batch 96 (about 12 GiB): the original's batches.
"""
import os

ACTIVATION_FACTOR = 0.85
FIXED_BYTES = 0.6 * 2 ** 30
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
# bytes per parameter during training: weights, gradients, momentum (float16: float16 weights and gradients,
# float32 master weights and momentum)
TRAIN_PARAM_BYTES = {"float16": 2 + 2 + 4 + 4}


def activation_elements(net, input_shape):
    """Elements of every layer output of ``net`` (a hybridizable block) for one input of ``input_shape`` (batch
    1, the network's layout): what the backward pass keeps, by layer, summed."""
    import mxnet as mx
    internals = net(mx.sym.var("data")).get_internals()
    outputs = [name for name in internals.list_outputs() if name.endswith("_output")]
    _, shapes, _ = internals.infer_shape_partial(data=tuple(input_shape))
    by_name = dict(zip(internals.list_outputs(), shapes))
    total = 0
    for name in outputs:
        shape = by_name.get(name)
        if shape:
            size = 1
            for dim in shape:
                size *= dim
            total += size
    return total


def parameter_count(net):
    """Elements of ``net``'s parameters, read from their first device's copy: Parameter.data() without a context
    asks for the current context, cpu(0), which a network on GPUs (or on [cpu(1), cpu(2)]) does not have."""
    return sum(int(p.list_data()[0].size) for p in net.collect_params().values())


def training_bytes(params, activations_per_image, batch_per_device, dtype):
    """Bytes one device needs to train with ``batch_per_device`` images."""
    param_bytes = params * TRAIN_PARAM_BYTES.get(dtype, 3 * 4)
    act_bytes = activations_per_image * DTYPE_BYTES.get(dtype, 4) * ACTIVATION_FACTOR
    return FIXED_BYTES + param_bytes + act_bytes * batch_per_device


def largest_batch(params, activations_per_image, dtype, budget, multiple=1):
    """The largest batch per device (a multiple of ``multiple``) whose estimate fits ``budget`` bytes; 0 when
    none does."""
    per_image = activations_per_image * DTYPE_BYTES.get(dtype, 4) * ACTIVATION_FACTOR
    room = budget - training_bytes(params, activations_per_image, 0, dtype)
    batch = int(room // per_image) if room > 0 else 0
    return batch - batch % multiple


def cpu_budget(processes_here, meminfo="/proc/meminfo", cgroup="/sys/fs/cgroup/memory.max"):
    """Bytes each of ``processes_here`` worker processes of this machine can use: the memory available now
    (MemAvailable, or the cgroup's limit when lower), shared equally. None where it cannot be read."""
    available = None
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(cgroup) as f:
            text = f.read().strip()
        if text.isdigit():
            limit = int(text)
            available = limit if available is None else min(available, limit)
    except OSError:
        pass
    return None if available is None else available // max(processes_here, 1)


def gpu_budget(ctx):
    """The GPU's total memory in bytes (None where MXNet cannot tell)."""
    import mxnet as mx
    try:
        return mx.context.gpu_memory_info(ctx.device_id)[1]
    except Exception:  # not a GPU build, or no such device
        return None


def gib(value):
    return f"{value / 2 ** 30:.1f} GiB"


def check(net, input_shape, dtype, global_batch, devices, processes_here, budget, where):
    """(problem, estimate): ``problem`` is one line when the estimate of training ``global_batch`` images over
    ``devices`` devices (``processes_here`` of them on this machine) exceeds ``budget`` bytes per device (None:
    unknown, nothing checked), naming a global batch that fits."""
    sizes = parameter_count(net), activation_elements(net, (1,) + tuple(input_shape[1:]))
    return check_sizes(sizes, input_shape, dtype, global_batch, devices, budget, where)


def check_sizes(sizes, input_shape, dtype, global_batch, devices, budget, where):
    """check() of a network known by its ``sizes``: (parameters, activation elements per image)."""
    params, activations = sizes
    per_device = max(global_batch // max(devices, 1), 1)
    need = training_bytes(params, activations, per_device, dtype)
    if budget is None or need <= budget:
        return None, need
    fits = largest_batch(params, activations, dtype, budget)
    advice = (f"use --batch-size {fits * devices} (global; {fits} per device: runner's -b {fits}) or fewer"
              if fits else "no batch fits: use a smaller network or image shape")
    return (f"training needs about {gib(need)} per device ({per_device} images of {'x'.join(map(str, input_shape[1:]))}"
            f" in {dtype}: {gib(activations * DTYPE_BYTES.get(dtype, 4) * ACTIVATION_FACTOR * per_device)} of "
            f"activations, {params / 1e6:.1f} M parameters) and {where} has {gib(budget)}; {advice} "
            "(--memory-check warn to try anyway)"), need


def environment_processes():
    """The worker processes on this machine: Horovod's local size, else 1."""
    for name in ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1
