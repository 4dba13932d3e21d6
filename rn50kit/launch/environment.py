"""The variables runner sets for the workers (a value already in the environment wins, so users can still tune
each one), and the terminal rank 0 may write to."""
import os
import sys

from rn50kit.config.cli import UsageError
from rn50kit.hardware import devices
from rn50kit.launch import arguments, hosts
from rn50kit.launch.launchers import elastic

# Variables of the original runner, each checked against the sources of upstream MXNet 1.9.1 and Horovod 0.28.1:
# kept only where the library reads it AND the value differs from its default. Left out: MXNET_EXEC_ENABLE_ADDTO,
# MXNET_USE_TENSORRT, MXNET_ASYNC_GPU_ENGINE, MXNET_HOROVOD_NUM_GROUPS and HOROVOD_GROUPED_ALLREDUCES (read only by
# NVIDIA's container builds); MXNET_UPDATE_ON_KVSTORE (gluon.Trainer ignores it when update_on_kvstore is given,
# and both our trainers give it: python/mxnet/gluon/trainer.py, Horovod's DistributedTrainer passes kvstore=None);
# MXNET_GPU_WORKER_NTHREADS=2 (the default, src/common/utils.h); HOROVOD_BATCH_D2D_MEMCOPIES=1 (the default: only 0
# changes anything, horovod/common/operations.cc); HOROVOD_ENABLE_ASYNC_COMPLETION (with MXNet 1.x Horovod's
# callback waits for the GPU event anyway, horovod/mxnet/mpi_ops.cc: no MXNET_ASYNC_GPU_ENGINE_SUPPORTED upstream).
# A value already in the environment wins, so users can still tune each one.
COMMON_ENV = {
    # CachedOp (hybridized training) bulks this many operators per engine op, forward and backward
    # (include/mxnet/imperative.h, read as CachedOpConfig's defaults; MXNet's default is 15 each): the whole
    # forward pass in one, smaller backward bulks so Horovod's allreduce of finished gradients starts earlier.
    "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD": "999",
    "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD": "25",
    "HOROVOD_FUSION_THRESHOLD": "67108864",  # 64 MiB tensor-fusion buffer, the original's (Horovod's default: 128)
}
GPU_ENV = {
    # ms between Horovod's fusion cycles (default 1): its background thread has a CPU core to itself on a GPU node
    "HOROVOD_CYCLE_TIME": "0.1",
    # SGD (not NAG) updates this many weights per multi-tensor kernel (python/mxnet/optimizer/optimizer.py, default
    # 4; the kernel holds at most 60, src/operator/optimizer_op-inl.h): fewer launches on a GPU. On CPU the fused
    # kernel is slower than one update per weight (measured: a quarter of a ResNet-18 training step).
    "MXNET_OPTIMIZER_AGGREGATION_SIZE": "60",
    "MXNET_GPU_COPY_NTHREADS": "1",  # copy threads per GPU (default 2; src/engine/threaded_engine_perdevice.cc)
    # cuDNN's heuristics pick convolution algorithms instead of a slow autotune at start-up (default 1, autotune;
    # src/operator/nn/cudnn/cudnn_convolution-inl.h)
    "MXNET_CUDNN_AUTOTUNE_DEFAULT": "0",
    # Replay each bulked segment of a static hybridized graph as a CUDA graph (default off): CachedOp's static
    # segments run through CudaGraphsExec (src/imperative/imperative_utils.h, src/executor/cuda_graphs.h) in
    # builds with CUDA >= 10.2, as the mxnet-cu112/cu117 wheels are; train.py hybridizes with static_alloc.
    "MXNET_ENABLE_CUDA_GRAPHS": "1",
    "OMP_NUM_THREADS": "1",  # the GPU computes; CPU operators only feed it, and DALI has its own threads
}


def build_env(args, machine, environ, extra, launcher):
    """The variables runner sets (values already in ``environ`` win); ``launcher`` (launchers.Launcher) adds its
    own."""
    env = dict(COMMON_ENV)
    if machine.gpus:
        env.update(GPU_ENV)
        visible = visible_devices(args, environ, extra, launcher)
        if visible is not None and "CUDA_VISIBLE_DEVICES" not in environ:
            env["CUDA_VISIBLE_DEVICES"] = visible  # one process, N GPUs: --gpus's, else the first N
    else:
        # The cores are shared: one OpenMP thread team per worker, each with its share.
        env["OMP_NUM_THREADS"] = str(max(1, machine.cores // hosts.workers_per_node(args, environ, launcher)))
        # Horovod's background thread polls every cycle; at the GPU setting (0.1 ms) it takes a core's share
        # from the workers' compute (ResNet-18, 224 px, 2 workers on 2 cores: 23 img/s at 0.1 ms, 34 at 20 ms).
        env["HOROVOD_CYCLE_TIME"] = "20"
    env.update(launcher.env(args))
    env = {key: environ.get(key, value) for key, value in env.items()}
    return elastic.without_unsafe_env(env) if elastic.is_elastic(args) else env


def visible_devices(args, environ, extra, launcher):
    """CUDA_VISIBLE_DEVICES for the one process of --kv-store device (devices.runner_visible_devices): --gpus
    selects the GPUs with every --kv-store (devices.select_gpus); -n must agree with it."""
    try:
        workers_here = hosts.workers_per_node(args, environ, launcher) if args.kv_store == "horovod" else args.ngpus
        return devices.runner_visible_devices(arguments.peek_extra(extra, args.file_values).gpus, workers_here,
                                              args.kv_store)
    except ValueError as error:
        raise UsageError(str(error))


def console_env(args, launcher):
    """Name runner's terminal to rank 0 (RN50_CONSOLE), which then writes its progress bar and log straight to
    it: horovodrun pipes the workers' output and prefixes every line. Only when every worker runs here and both
    stdout and stderr are that terminal (`./runner | tee run.log` keeps every line in the pipe)."""
    if launcher.places_workers or hosts.host_slots(args) is not None or \
            not (sys.stdout.isatty() and sys.stderr.isatty()):
        return {}
    try:
        terminal = os.ttyname(sys.stderr.fileno())
        return {"RN50_CONSOLE": terminal} if os.ttyname(sys.stdout.fileno()) == terminal else {}
    except OSError:
        return {}
