"""What a fault campaign's trial is (tools/fault_campaign.py): a launcher, a fault, a moment and sometimes a second
fault, all drawn from the trial's seed, so a trial is replayed from its seed alone.

The launchers are how a user starts a two-worker run on this machine: horovodrun, mpirun (``--launcher mpi``),
srun on the one-node Slurm (``--launcher slurm``), horovodrun over SSH to the two loopback hosts hostA and hostB,
and an elastic run over SSH (``--min-np 1``: a worker lost, the run goes on). The faults and the moments are those
issue 57 names; each fault has the moments that make sense for it (a kill inside a checkpoint write only at a save,
an elastic reset only in an elastic run). Only the standard library."""
import dataclasses
import random

LAUNCHERS = ("horovodrun", "mpirun", "srun", "ssh", "elastic")
SSH_LAUNCHERS = ("ssh", "elastic")
FAULTS = ("sigkill", "sigstop", "exception", "segfault", "runner-sigkill", "sigterm-all", "full-disk",
          "kill-in-save", "lost-host")
# A fault the target worker does to itself at the moment (its hook); the others the campaign does from outside
# while the worker waits at the moment (campaign_hooks: the worker names itself, then waits for the go-on).
SELF_INFLICTED = ("exception", "segfault", "kill-in-save")
MOMENTS = ("step", "validation", "save", "report", "reset")
EPOCHS = 2  # a checkpoint before the faults of epoch 2; a fault in epoch 1 finds none (the rerun starts again)
STEPS_PER_EPOCH = 3  # 48 synthetic examples, 2 workers x 8
# A save's file operations (tests/e2e/test_kill_at_every_write.py counts them): each file's write, fsync and rename,
# the folder's fsync; 12, or 15 with a new best (its copy).
SAVE_OPERATIONS = 12
SECOND_FAULT_CHANCE = 0.25  # the first rerun is faulted too, then the user reruns once more


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` (FAULTS) at ``moment`` (MOMENTS) of ``epoch`` (1-based; ``step``: the step of that epoch
    for the moment "step", or the file operation for a kill inside a save), in the worker of ``target`` (a rank,
    or under an elastic run a host's name)."""
    kind: str
    moment: str
    epoch: int
    step: int
    target: str

    def describe(self):
        where = f"step {self.step} of epoch {self.epoch}" if self.moment == "step" else \
            f"file operation {self.step} of epoch {self.epoch}'s save" if self.kind == "kill-in-save" else \
            f"the {self.moment} of epoch {self.epoch}" if self.moment != "report" else "the final report"
        return f"{self.kind} of {self.target} at {where}"


@dataclasses.dataclass(frozen=True)
class Trial:
    seed: int
    launcher: str
    fault: Fault
    second: Fault = None  # in the first rerun, or None

    def describe(self):
        second = f"; then in the rerun {self.second.describe()}" if self.second else ""
        return f"seed {self.seed}: {self.launcher}, {self.fault.describe()}{second}"

    def as_dict(self):
        return dataclasses.asdict(self)


def moments_for(kind, launcher):
    """The moments ``kind`` can strike at under ``launcher``."""
    if kind == "kill-in-save":
        return ("save",)
    moments = [m for m in MOMENTS if m != "reset" or launcher == "elastic"]
    if kind in ("lost-host", "runner-sigkill", "sigterm-all"):
        moments = [m for m in moments if m != "reset"]  # a reset needs the run's own first fault
    if kind == "lost-host" and launcher == "elastic":
        moments = [m for m in moments if m != "save"]  # the elastic run's host lost is hostA, which never saves
    return tuple(moments)


def faults_for(launcher):
    return tuple(f for f in FAULTS if f != "lost-host" or launcher in SSH_LAUNCHERS)


def target_for(kind, moment, launcher, rng):
    """Whose fault it is: rank 0 saves (a save, a full disk, a kill in a save); under SSH the lost host is hostB's
    rank 1; an elastic run loses hostA's worker (Horovod blacklists a failed worker's host: the run's own host
    must stay), except at a reset, where the worker left (on localhost) is struck."""
    if launcher == "elastic":
        saves = moment == "save" or kind in ("full-disk", "kill-in-save")
        return "localhost" if moment == "reset" or saves and kind != "lost-host" else "hostA"
    if moment == "save" or kind in ("full-disk", "kill-in-save"):
        return "0"
    if kind == "lost-host":
        return "1"
    return rng.choice(("0", "1"))


def draw_fault(rng, launcher, kind=None):
    kind = kind or rng.choice(faults_for(launcher))
    moment = rng.choice(moments_for(kind, launcher))
    epoch = EPOCHS if moment == "report" else rng.randint(1, EPOCHS)
    step = rng.randint(1, SAVE_OPERATIONS) if kind == "kill-in-save" else rng.randint(1, STEPS_PER_EPOCH)
    return Fault(kind, moment, epoch, step, target_for(kind, moment, launcher, rng))


def draw(seed, launcher=None, kind=None):
    """The trial of ``seed`` (``launcher`` and ``kind`` fixed by the caller, or drawn)."""
    rng = random.Random(seed)
    launcher = launcher or rng.choice(LAUNCHERS)
    fault = draw_fault(rng, launcher, kind)
    second = None
    if rng.random() < SECOND_FAULT_CHANCE and fault.moment != "reset":
        second = draw_fault(rng, launcher)
        second = second if second.moment != "reset" else None
    return Trial(seed, launcher, fault, second)


def trial_seeds(campaign_seed, count):
    """The seeds of a campaign's trials: each trial replays alone from its own."""
    return [campaign_seed * 100_000 + index for index in range(count)]


def second_reachable(trial):
    """Whether the trial's second fault will strike in the rerun: the first in epoch 1 (the rerun resumes within
    or after it), the second in the last epoch before its final report."""
    second = trial.second
    return second is not None and trial.fault.epoch == 1 and trial.fault.moment != "report" and \
        second.epoch == EPOCHS and second.moment in ("step", "validation", "save")


# The covering set's trials: (launcher, fault, the second fault in the rerun or None); every launcher and fault once.
COVERING = (("horovodrun", "sigkill", "sigterm-all"), ("mpirun", "sigstop", "full-disk"),
            ("srun", "exception", "kill-in-save"), ("ssh", "segfault", "lost-host"),
            ("elastic", "runner-sigkill", None))


def covering_set(campaign_seed):
    """Few trials that together strike under every launcher and with every fault kind (COVERING), each the first
    seed from the campaign's whose own draw is that (its second fault sure to strike), so --replay SEED replays
    it. A second fault in the rerun costs one run, a trial of its own two."""
    trials, seed = [], campaign_seed * 100_000
    for launcher, kind, second in COVERING:
        while True:
            trial = draw(seed)
            seed += 1
            if (trial.launcher, trial.fault.kind) == (launcher, kind) and (
                    trial.second is None if second is None else
                    second_reachable(trial) and trial.second.kind == second):
                break
        trials.append(trial)
    return trials
