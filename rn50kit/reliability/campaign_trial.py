"""One trial of a fault campaign (tools/fault_campaign.py), and what it checks, as a user would see it:
- the faulted run ended within --stall-timeout plus the campaign's margin of the fault (an elastic run may go on
  instead, and end well);
- runner's last line names what failed (the rank and the cause; after SIGTERM to every process, that it stopped
  after saving); a runner killed outright says nothing, and is not asked to;
- no process of the run is left (on either host) and the workspace lock is free;
- the newest complete checkpoint loads (``Setup``'s caller gives that check: it needs MXNet, this folder not);
- rerunning the same command (after a second fault in the rerun, once more) ends well with the per-epoch metrics
  of the unfaulted run with the same --seed: equal for a fixed world (the losses to a relative 1e-6: the
  BatchNorm statistics averaged at a stop reorder additions), within ELASTIC_TOP1_TOLERANCE of its validation
  top-1 for an elastic run (its world and so its batches per worker changed).
Work redone: the steps trained in all of the trial's runs beyond the unfaulted run's. Time to notice: from the
fault to the run's end (for an elastic run that went on, Horovod's notice of the lost worker)."""
import json
import os
import shutil
import time

from rn50kit.reliability import campaign_runs, run_lock
from rn50kit.reliability.campaign_plan import EPOCHS, STEPS_PER_EPOCH

ELASTIC_TOP1_TOLERANCE = 0.2  # as tests/e2e/test_elastic_training.py: per-worker BatchNorm batches change
COMPARED_EXACTLY = ("train.top1", "train.top5", "val.top1", "val.top5")
COMPARED_CLOSELY = ("train.loss", "val.loss")
GONE_GRACE_S = 10  # runner waits for its workers: once it ended, the kernel's last clean-up only
# What runner's last line must say, by fault ({rank}: the rank struck).
NAMED = {"sigkill": ("rank {rank} ", "SIGKILL"), "sigstop": ("rank {rank} ", "stalled"),
         "exception": ("rank {rank} ", "RuntimeError: injected fault"), "segfault": ("rank {rank} ", "SIGSEGV"),
         "full-disk": ("rank 0 ", "the disk is full"), "kill-in-save": ("rank 0 ", "SIGKILL"),
         "lost-host": ("rank {rank} (host {host}",)}
# Over SSH a worker's status is ssh's 255, as for a lost connection: the line names the rank and SIGKILL where the
# worker's shell said "Killed" before the connection ended, else ssh's status with both causes (a "|" between
# words: either). A crash is told apart by faulthandler's line.
NAMED_OVER_SSH = {"sigkill": ("rank {rank} ", "SIGKILL|status 255 (ssh's"),
                  "kill-in-save": ("rank 0 ", "SIGKILL|status 255 (ssh's")}
STOPPED_LINE = "runner: stopped by signal after saving a checkpoint; rerun the same command to resume"


def records(workspace, kind):
    try:
        with open(os.path.join(workspace, "log.jsonl")) as f:
            return [r for r in map(json.loads, f) if r.get("type") == kind]
    except (OSError, ValueError):
        return []


def metrics(workspace):
    try:
        with open(os.path.join(workspace, "report.json")) as f:
            return json.load(f)["metrics"]
    except (OSError, ValueError, KeyError):
        return None


def reference(setup, launcher, folder):
    """The unfaulted run for ``launcher`` (made once per campaign folder): its metrics and its steps. horovodrun's
    stands for mpirun's and srun's (measured equal: two workers of one thread each, and a sum of two values
    does not depend on its order); the SSH hosts' workers each have both cores (another OpenMP team), and an
    elastic run reads the digits, so theirs are their own."""
    launcher = launcher if launcher in ("ssh", "elastic") else "horovodrun"
    path = os.path.join(folder, "references", f"{launcher}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    workspace = os.path.join(folder, "references", launcher)
    shutil.rmtree(workspace, ignore_errors=True)
    os.makedirs(workspace)
    started = time.time()
    run = campaign_runs.run(setup, launcher, workspace, workspace + "-run")
    if run.status != 0 or metrics(workspace) is None:
        raise RuntimeError(f"the unfaulted {launcher} run failed (status {run.status}): {run.last_line}; "
                           f"its output: {workspace}-run.err")
    made = {"metrics": metrics(workspace), "steps": len(records(workspace, "iter")), "seconds": time.time() - started}
    with open(path, "w") as f:
        json.dump(made, f)
    return made


def finished(workspace):
    """Whether the run trained and validated every epoch: so it ends after a stop signal in its last step, its last
    validation, save or report (no step boundary is left to stop at)."""
    return len((metrics(workspace) or {}).get("val.top1", [])) == EPOCHS


def line_problem(fault, launcher, run, workspace):
    """What is wrong with runner's last line after ``fault``, or None."""
    if fault.kind == "runner-sigkill":
        return None  # runner cannot speak; the workers' own lines are all there is
    if fault.kind == "sigterm-all":
        last = fault.epoch == EPOCHS and (fault.moment != "step" or fault.step == STEPS_PER_EPOCH)
        ok = run.status == 0 and (run.last_line == STOPPED_LINE or last and finished(workspace))
        return None if ok else f"after SIGTERM to every process: status {run.status}, last line {run.last_line!r}"
    if launcher == "elastic" and run.status == 0:
        return None  # the run went on without the worker
    # A worker cut off from runner (a lost connection) lives on, and may finish the run: then runner notes the
    # failure and ends well.
    done = run.status == 0 and finished(workspace)
    if not run.last_line.startswith("runner: note: " if done else "runner: error: "):
        return f"the last line is not runner's one line: {run.last_line[:300]!r}"
    rank = fault.target if fault.target.isdigit() else None
    host = "hostA" if rank == "0" else "hostB"  # -H hostA:1,hostB:1
    named = NAMED_OVER_SSH if launcher == "ssh" and fault.kind in NAMED_OVER_SSH else NAMED
    wanted = [w.format(rank=rank, host=host) for w in named.get(fault.kind, ()) if rank is not None or "{" not in w]
    missing = [w for w in wanted if not any(word in run.last_line for word in w.split("|"))]
    return f"the last line does not name {missing}: {run.last_line[:300]!r}" if missing else None


def left_behind(workspace):
    """Processes of the run still alive after GONE_GRACE_S, or a held workspace lock: a problem line, or None."""
    deadline = time.time() + GONE_GRACE_S
    while any(campaign_runs.alive(m) for m in campaign_runs.members(workspace)) and time.time() < deadline:
        time.sleep(0.1)
    left = [m for m in campaign_runs.members(workspace) if campaign_runs.alive(m)]
    problems = []
    if left:
        names = []
        for member in left[:4]:
            try:
                names.append(f"{member.pid} {' '.join(member.cmdline())[:80]}")
            except Exception:  # noqa: BLE001  gone meanwhile
                pass
        problems.append(f"{len(left)} process(es) of the run left: {names}")
    holder = run_lock.holder(str(workspace))
    if holder is not None:
        problems.append(f"the workspace lock is still held by pid {holder.get('pid')}")
    return problems


def check_faulted(setup, fault, launcher, run, workspace):
    """The checks after one faulted run: a list of problems (empty: it held)."""
    problems = []
    hit = [t for t in run.struck if t is not None]
    if not hit:
        return problems  # its moment never came (already past in a resumed run): nothing to check
    noticed = run.ended - max(hit)
    if run.hung:
        problems.append(f"the run did not end within {noticed:.0f} s of the fault (--stall-timeout "
                        f"{setup.stall_timeout} + {setup.margin} s); ended by hand")
    elif launcher == "elastic" and run.status != 0 and noticed > setup.stall_timeout + setup.margin:
        problems.append(f"the elastic run ended {noticed:.0f} s after the fault, beyond the stall timeout + margin")
    problem = line_problem(fault, launcher, run, workspace)
    if problem:
        problems.append(problem)
    problems += left_behind(workspace)
    problem = setup.checkpoint_check(workspace) if setup.checkpoint_check else None
    if problem:
        problems.append(problem)
    return problems


def metrics_problem(launcher, final, expected):
    if final is None:
        return "the rerun wrote no report"
    if launcher == "elastic":
        top1, want = final.get("val.top1", []), expected.get("val.top1", [])
        if len(top1) != len(want) or abs(top1[-1] - want[-1]) > ELASTIC_TOP1_TOLERANCE:
            return f"validation top-1 {top1} against {want} unfaulted (tolerance {ELASTIC_TOP1_TOLERANCE})"
        return None
    for key in COMPARED_EXACTLY + COMPARED_CLOSELY:
        if key not in expected:
            continue
        got, want = final.get(key, []), expected[key]
        close = len(got) == len(want) and all(
            g == w if key in COMPARED_EXACTLY else abs(g - w) <= 1e-6 * max(abs(w), 1e-12) for g, w in zip(got, want))
        if not close:
            return f"{key} per epoch {got} against {want} unfaulted"
    return None


def noticed_after(launcher, run, workspace):
    """Seconds from the (last) fault to the run's end, or for an elastic run that went on, to Horovod's notice of
    the lost worker (None: no fault struck, or the run went on without a world change)."""
    hit = [t for t in run.struck if t is not None]
    if not hit:
        return None
    if launcher == "elastic" and run.status == 0:
        changes = records(workspace, "world_change")
        return changes[-1].get("detected_after") if changes else None
    return run.ended - max(hit)


def had_checkpoint(workspace):
    """Whether a save got as far as a state file under its final name (a save cut short leaves ".tmp-<prefix>
    .state.json", which is no checkpoint: the fault campaign, seeds 200088 and 200094)."""
    return os.path.isdir(workspace) and any(n.endswith(".state.json") and not n.startswith(".tmp-")
                                            for n in os.listdir(workspace))


def run_trial(setup, trial, folder):
    """Run ``trial`` (campaign_plan.Trial) in ``folder`` (emptied first); returns its result, a JSON-able dict."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    expected = reference(setup, trial.launcher, os.path.dirname(os.path.dirname(folder)))
    workspace = os.path.join(folder, "ws")
    result = {"seed": trial.seed, "trial": trial.describe(), "launcher": trial.launcher, "plan": trial.as_dict(),
              "faults": [], "problems": []}
    for index, fault in enumerate(f for f in (trial.fault, trial.second) if f is not None):
        faults = campaign_runs.planned(trial.launcher, fault)
        run = campaign_runs.run(setup, trial.launcher, workspace, os.path.join(folder, f"run-{index}"), faults,
                                os.path.join(folder, f"inject-{index}"))
        problems = check_faulted(setup, fault, trial.launcher, run, workspace)
        result["faults"].append({"kind": fault.kind, "moment": fault.moment, "struck": run.struck[-1] is not None,
                                 "status": run.status, "last_line": run.last_line,
                                 "noticed_s": noticed_after(trial.launcher, run, workspace),
                                 "world_changes": len(records(workspace, "world_change"))})
        result["problems"] += [f"after {fault.describe()}: {p}" for p in problems]
    resumable = had_checkpoint(workspace)
    rerun = campaign_runs.run(setup, trial.launcher, workspace, os.path.join(folder, "rerun"))
    if rerun.status != 0:
        result["problems"].append(f"the rerun failed (status {rerun.status}): {rerun.last_line[:300]!r}")
    elif resumable and "Resuming from " not in rerun.stderr:
        result["problems"].append("the rerun did not resume from the checkpoint left")
    else:
        problem = metrics_problem(trial.launcher, metrics(workspace), expected["metrics"])
        if problem:
            result["problems"].append(f"the rerun's metrics: {problem}")
    result["steps_redone"] = len(records(workspace, "iter")) - expected["steps"]
    result["survived"] = not result["problems"]
    if result["survived"]:
        shutil.rmtree(workspace, ignore_errors=True)  # its checkpoints: 100 trials would fill a disk
    return result
