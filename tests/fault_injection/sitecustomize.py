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
  autotuning or a JIT can take; 120 ms between the medians steadiness compares, far above a step's noise.
- RN50_INJECT_KIND=kill-in-save (tests/e2e/test_kill_at_every_write.py): in checkpoint.save of epoch
  RN50_INJECT_EPOCH, each file operation (a file's write, its fsync, its rename, the folder's fsync) is counted and
  appended to the file RN50_INJECT_LOG; the worker kills itself (SIGKILL) just before operation RN50_INJECT_STEP
  (0: never)."""
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


class Overridden:
    """``module`` with some of its functions replaced, for one module's uses of it only."""
    def __init__(self, module, **functions):
        self._module = module
        self.__dict__.update(functions)

    def __getattr__(self, name):
        return getattr(self._module, name)


def kill_in_save(checkpoint):
    """Wrap each file operation of ``checkpoint.save`` (see the module's docstring)."""
    import json
    import shutil
    epoch, kill_at, log = (int(os.environ.get("RN50_INJECT_EPOCH", "2")), int(os.environ.get("RN50_INJECT_STEP", "0")),
                           os.environ.get("RN50_INJECT_LOG"))
    active, count = [False], [0]

    def operation(kind, function, file_of):
        def wrapped(*args, **kwargs):
            if active[0]:
                count[0] += 1
                if log:
                    with open(log, "a") as f:
                        f.write(f"{count[0]} {kind} {os.path.basename(file_of(*args))}\n")
                if count[0] == kill_at:
                    kill_self(count[0])
            return function(*args, **kwargs)
        return wrapped

    save = checkpoint.save

    def save_counted(prefix, net, trainer, state, *args, **kwargs):
        active[0] = state["epoch"] == epoch
        try:
            return save(prefix, net, trainer, state, *args, **kwargs)
        finally:
            active[0] = False
    checkpoint.save = save_counted
    checkpoint._export = operation("write", checkpoint._export, lambda net, tmp: tmp + "-0000.params+symbol.json")
    checkpoint._fsync = operation("fsync", checkpoint._fsync, lambda path: path)
    checkpoint._fsync_dir = operation("fsync", checkpoint._fsync_dir, lambda directory: "(folder)")
    checkpoint.os = Overridden(os, replace=operation("rename", os.replace, lambda tmp, final: final))
    checkpoint.json = Overridden(json, dump=operation("write", json.dump, lambda state, f, **kw: f.name))
    checkpoint.shutil = Overridden(shutil, copyfile=operation("write", shutil.copyfile, lambda src, dst: dst))
    from rn50kit.weights import optimizer_state  # checkpoint.save imports it where it saves
    optimizer_state.save = operation("write", optimizer_state.save, lambda trainer, path: path)


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
if _WORKER and os.environ.get("RN50_INJECT_KIND") == "kill-in-save":
    patch_on_import("rn50kit.weights.checkpoint", kill_in_save)
