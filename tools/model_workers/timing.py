"""What both libraries' workers measure with: images/s of a step, a matrix product's rate (the ceiling), and
whether this CPU has bfloat16 kernels worth timing."""
import time

from rn50kit.common import rules  # MXNet-free: the PyTorch worker imports it too

CEILING_SIZE = 2048  # the matrix products' side


def bfloat16_missing(cpuinfo="/proc/cpuinfo"):
    """Why this CPU has no bfloat16 worth timing, or None (also where the flags cannot be read). oneDNN's bfloat16
    kernels (in both libraries) need AVX-512 (F, BW, VL, DQ), the rule train.py refuses by (rules.py); kept free of
    MXNet for the PyTorch worker. Without them MXNet fails ("could not create a primitive descriptor") and PyTorch
    emulates (1.2 GFLOP/s for a matrix product on an AVX2 EPYC)."""
    return rules.bfloat16_problem("bfloat16", rules.cpu_flags(cpuinfo))


def timed(step, batch_size, iters, warmup):
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    return batch_size * iters / (time.perf_counter() - start)


def matmul_rate(product, size, iters=5):
    """GFLOP/s (GOP/s for integers) of ``product()``, a size x size x size matrix product."""
    product()
    start = time.perf_counter()
    for _ in range(iters):
        product()
    return 2 * size ** 3 * iters / (time.perf_counter() - start) / 1e9
