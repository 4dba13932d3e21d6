"""tools/gpu_check.py's checks, a module per kind: environment (versions, driver, kernels, Horovod's build),
numerics, fused_batchnorm, training, pipelines (the data), collectives, speed (layouts and memory). Each check is
``check_<name>(machine, args) -> (verdict, detail, data)``; gpu_check.py lists them, runs them and reports."""
import os

# Verdicts besides pass, warn and fail.
NOT_RUN = "not run (no GPU)"
NOT_APPLICABLE = "not applicable"
NO_KERNELS = "not run (no MXNet kernels for this GPU)"
# The checks that need a fresh process start gpu_check.py again with a hidden flag (--step-worker,
# --allreduce-worker).
GPU_CHECK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_check.py")
