"""A fault campaign's hooks inside train.py's workers (tools/fault_campaign.py), installed by the sitecustomize the
campaign writes into each trial's injection folder (first on PYTHONPATH, which every launcher passes on; mpirun
passes no other variable of ours, so the plan is a file beside it, ``plan.json``).

Each planned fault names a worker (a rank, or under an elastic run a host) and a moment: a step of an epoch, the
epoch's validation, its checkpoint save, the final report, an elastic reset. When the named worker reaches it, a
fault it can do to itself happens there (an exception, a native crash); for the others (a kill, a stop, a full
disk, a lost host, a signal to every process, runner killed) it names itself in ``fault-N.json`` and waits for the
campaign's ``fault-N.go``, so the campaign strikes at that very moment. A kill inside a checkpoint write is the
test injection's own (tests/fault_injection: kill-in-save), which the sitecustomize runs first. Only the standard
library: it is loaded into every process the launchers start."""
import json
import os
import socket
import sys
import time

RANK_MARKS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
GO_PATIENCE_S = 300  # the campaign answers within moments; a campaign killed meanwhile must not hang the worker
SELF_INFLICTED = ("exception", "segfault")


def identity(environ=os.environ):
    """(rank, host) of this worker as its launcher marks them; the host as in runner's -H under horovodrun."""
    rank = next((environ[mark] for mark in RANK_MARKS if mark in environ), None)
    return rank, environ.get("HOROVOD_HOSTNAME", "")


def is_target(fault, environ=os.environ):
    rank, host = identity(environ)
    return fault["target"] == (rank if fault["target"].isdigit() else host)


def strike(index, fault, folder):
    """The fault, here and now: done by this worker, or by the campaign while this worker waits."""
    marker = os.path.join(folder, f"fault-{index}.json")
    if fault["kind"] in SELF_INFLICTED:
        open(marker + ".struck", "w").close()  # when, for the campaign's time to notice
        if fault["kind"] == "exception":
            raise RuntimeError(f"injected fault at {fault['moment']}")
        import ctypes
        ctypes.string_at(0)  # reads address 0: SIGSEGV, as a crash in a native library
    tmp = f"{marker}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "host": socket.gethostname(), "time": time.time(),
                   "rank": identity()[0]}, f)
    os.replace(tmp, marker)
    go = os.path.join(folder, f"fault-{index}.go")
    deadline = time.monotonic() + GO_PATIENCE_S
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)


class Moments:
    """Where this worker is (epoch, step within it) and which planned faults are still to come."""

    def __init__(self, faults, folder):
        self.pending = [(index, fault) for index, fault in enumerate(faults)
                        if is_target(fault) and fault["kind"] != "kill-in-save"]  # the test injection's
        self.folder = folder
        self.epoch, self.step = 0, 0

    def reached(self, moment, epoch=None, step=None):
        for index, fault in list(self.pending):
            if fault["moment"] != moment or (epoch is not None and fault["epoch"] != epoch) or \
                    (step is not None and fault["step"] != step):
                continue
            self.pending.remove((index, fault))
            strike(index, fault, self.folder)


def wrap(function, before):
    def wrapped(*args, **kwargs):
        before(*args, **kwargs)
        return function(*args, **kwargs)
    wrapped.__wrapped__ = function
    return wrapped


def patch_fit(fit, moments):
    def epoch_begins(cfg, loop, state, train_iter, epoch, skip=0):
        moments.epoch, moments.step = epoch + 1, skip

    def step_begins(*args, **kwargs):
        moments.step += 1
        moments.reached("step", moments.epoch, moments.step)

    fit.train_one_epoch = wrap(fit.train_one_epoch, epoch_begins)
    fit.train_step = wrap(fit.train_step, step_begins)
    fit.validate_epoch = wrap(fit.validate_epoch, lambda cfg, loop, state, val_iter, epoch:
                              moments.reached("validation", epoch + 1))


def patch_checkpoint(checkpoint, moments):
    def save_begins(prefix, net, trainer, state, *args, **kwargs):
        if not state.get("step"):
            moments.reached("save", state["epoch"])
    checkpoint.save = wrap(checkpoint.save, save_begins)


def patch_outputs(outputs, moments):
    cls = outputs.ReportOutput
    cls.run_end = wrap(cls.run_end, lambda *args, **kwargs: moments.reached("report"))


def patch_elastic(elastic, moments):
    cls = elastic.ElasticTraining
    cls.reset = wrap(cls.reset, lambda *args, **kwargs: moments.reached("reset"))


def install(plan, patch_on_import):
    """In a train.py worker: hook the moments of ``plan["faults"]`` that name this worker (``patch_on_import``:
    the test injection's, patching a module as it is first imported)."""
    if not (sys.argv and sys.argv[0].endswith("train.py")):
        return
    moments = Moments(plan["faults"], plan["folder"])
    if not moments.pending:
        return
    patch_on_import("fit", lambda fit: patch_fit(fit, moments))
    patch_on_import("rn50kit.weights.checkpoint", lambda checkpoint: patch_checkpoint(checkpoint, moments))
    patch_on_import("rn50kit.reporting.outputs", lambda outputs: patch_outputs(outputs, moments))
    patch_on_import("rn50kit.training.elastic", lambda elastic: patch_elastic(elastic, moments))


SITECUSTOMIZE = '''"""Written by tools/fault_campaign.py for one run of a trial (see campaign_hooks.py)."""
import importlib.util
import json
import os
import sys

_plan = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan.json")))
os.environ.update(_plan["env"])
# The test injection, loaded as a module (runpy.run_path would hide this process's sys.argv[0] from it).
_spec = importlib.util.spec_from_file_location("rn50_fault_injection", _plan["injection"])
_injection = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_injection)
sys.path.insert(0, _plan["root"])
from rn50kit.reliability import campaign_hooks  # noqa: E402
campaign_hooks.install(_plan, _injection.patch_on_import)
'''


def write_injection(folder, root, faults, env):
    """The injection folder of one run: its sitecustomize and its plan (``faults``: dicts of campaign_plan.Fault;
    ``env``: variables for the test injection, e.g. its kill-in-save)."""
    os.makedirs(folder, exist_ok=True)
    plan = {"faults": faults, "folder": folder, "root": root, "env": env,
            "injection": os.path.join(root, "tests", "fault_injection", "sitecustomize.py")}
    with open(os.path.join(folder, "plan.json"), "w") as f:
        json.dump(plan, f)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    return folder
