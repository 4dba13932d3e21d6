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
