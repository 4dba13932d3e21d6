"""Test-only fault injection (tests/e2e/test_fault_recovery.py and test_elastic_training.py put this folder on
PYTHONPATH), in train.py's worker processes only; every other process (runner, the launcher) is untouched:
- RN50_INJECT_RANK: in the worker whose rank (its launcher's mark: HOROVOD_RANK, OMPI_COMM_WORLD_RANK or
  SLURM_PROCID) it names, fit.train_step raises RuntimeError at call RN50_INJECT_STEP, or with
  RN50_INJECT_KIND=hang sleeps there for an hour (a rank alive but stuck: a hung file system, a GPU fault), or with
  RN50_INJECT_KIND=segfault crashes there (SIGSEGV, as a bug in a native library).
- RN50_INJECT_KIND=kill-in-commit with RN50_INJECT_HOST: the worker on that host (horovodrun's HOROVOD_HOSTNAME: an
  elastic run's ranks change) kills itself (SIGKILL) inside its RN50_INJECT_STEP-th in-memory commit (the first is
  the run's start), after the commit's first collective: the others finish theirs and fail in its next one.
- RN50_INJECT_KIND=slow-start: in every worker, call k of the first RN50_INJECT_STEP (N) calls of fit.train_step
  sleeps 40 ms x (N - k) first: a warm-up longer than benchmark.py's first untimed iterations, as a GPU's
  autotuning or a JIT can take; 120 ms between the medians steadiness compares, far above a step's noise."""
import os
import sys


def patch_on_import(module_name, patch):
    """Run ``patch(module)`` right after ``module_name`` is first imported."""
    import importlib.abc
    import importlib.util

    class Patcher(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != module_name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run_module = spec.loader.exec_module

            def exec_module(module):
                run_module(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Patcher())


def at_call(number, function, fault):
    """``function`` that runs ``fault()`` at its ``number``-th call (counting from 1) first."""
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == number:
            fault(calls[0])
        return function(*args, **kwargs)
    return wrapped


def raise_or_hang(call):
    if os.environ.get("RN50_INJECT_KIND") == "hang":
        import time
        time.sleep(3600)
    if os.environ.get("RN50_INJECT_KIND") == "segfault":
        import ctypes
        ctypes.string_at(0)  # reads address 0: SIGSEGV, as a crash in a native library
    raise RuntimeError(f"injected fault at step {call}")


def slow_start(function, calls_slowed):
    """``function``, its call k of the first ``calls_slowed`` preceded by a sleep of 40 ms x (calls_slowed - k)."""
    import time
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        time.sleep(0.04 * max(calls_slowed - calls[0], 0))
        return function(*args, **kwargs)
    return wrapped


def kill_self(call):
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


_RANK = next((os.environ[mark] for mark in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
              if mark in os.environ), "-")
_WORKER = bool(sys.argv) and sys.argv[0].endswith("train.py")
if _WORKER and os.environ.get("RN50_INJECT_RANK") == _RANK:
    patch_on_import("fit", lambda fit: setattr(fit, "train_step", at_call(
        int(os.environ.get("RN50_INJECT_STEP", "1")), fit.train_step, raise_or_hang)))
if _WORKER and os.environ.get("RN50_INJECT_KIND") == "kill-in-commit" and \
        os.environ.get("HOROVOD_HOSTNAME") == os.environ.get("RN50_INJECT_HOST"):
    patch_on_import("rn50kit.training.elastic", lambda elastic: setattr(
        elastic.ElasticTraining, "save_now", at_call(int(os.environ.get("RN50_INJECT_STEP", "2")),
                                                     elastic.ElasticTraining.save_now, kill_self)))
if _WORKER and os.environ.get("RN50_INJECT_KIND") == "slow-start":
    patch_on_import("fit", lambda fit: setattr(fit, "train_step", slow_start(
        fit.train_step, int(os.environ.get("RN50_INJECT_STEP", "25")))))
