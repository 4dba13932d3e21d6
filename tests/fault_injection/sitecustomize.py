"""Test-only fault injection (tests/e2e/test_fault_recovery.py puts this folder on PYTHONPATH): in the worker whose
rank (its launcher's mark: HOROVOD_RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID) is RN50_INJECT_RANK, fit.train_step
raises RuntimeError at call RN50_INJECT_STEP, or with RN50_INJECT_KIND=hang sleeps there for an hour (a rank alive
but stuck: a hung file system, a GPU fault). Every other process (runner, the launcher, the other ranks) is
untouched."""
import os
import sys

_RANK = next((os.environ[mark] for mark in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
              if mark in os.environ), "-")
if os.environ.get("RN50_INJECT_RANK") not in (None, _RANK) or \
        "RN50_INJECT_RANK" not in os.environ or not sys.argv or not sys.argv[0].endswith("train.py"):
    pass
else:
    import importlib.abc
    import importlib.util

    class _InjectIntoFit(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "fit":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run_module = spec.loader.exec_module

            def exec_module(module):
                run_module(module)
                real_step, calls = module.train_step, [0]

                def train_step(*args, **kwargs):
                    calls[0] += 1
                    if calls[0] == int(os.environ.get("RN50_INJECT_STEP", "1")):
                        if os.environ.get("RN50_INJECT_KIND") == "hang":
                            import time
                            time.sleep(3600)
                        raise RuntimeError(f"injected fault at step {calls[0]}")
                    return real_step(*args, **kwargs)
                module.train_step = train_step
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _InjectIntoFit())


# RN50_INJECT_KIND=kill-in-commit: the worker on host RN50_INJECT_HOST (horovodrun's HOROVOD_HOSTNAME: an elastic
# run's ranks change) kills itself (SIGKILL) inside its RN50_INJECT_STEP-th in-memory commit (the first is the
# run's start), after the commit's first collective: the others finish theirs and fail in its next one.
if os.environ.get("RN50_INJECT_KIND") == "kill-in-commit" and sys.argv and sys.argv[0].endswith("train.py") and \
        os.environ.get("HOROVOD_HOSTNAME") == os.environ.get("RN50_INJECT_HOST"):
    import importlib.abc
    import importlib.util

    class _InjectIntoCommit(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "rn50kit.training.elastic":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run_module = spec.loader.exec_module

            def exec_module(module):
                run_module(module)
                real_save, calls = module.ElasticTraining.save_now, [0]

                def save_now(self, *args, **kwargs):
                    calls[0] += 1
                    if calls[0] == int(os.environ.get("RN50_INJECT_STEP", "2")):
                        import signal
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real_save(self, *args, **kwargs)
                module.ElasticTraining.save_now = save_now
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _InjectIntoCommit())
