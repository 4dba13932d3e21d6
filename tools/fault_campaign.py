"""A seeded, resumable fault campaign over every launcher (issue 57): how often the kit survives a fault at a
moment it was not written for.

    python tools/fault_campaign.py --trials 100 --seed 1 --out runs/campaign      (rerun: goes on where it stopped)
    python tools/fault_campaign.py --covering --seed 1 --out runs/ci-campaign     (every launcher and fault once)
    python tools/fault_campaign.py --out runs/campaign --replay 100007             (one trial again, by its seed)
    python tools/fault_campaign.py --trials 100 --seed 1 --out runs/campaign --report   (the trials done so far)

Each trial draws a launcher (horovodrun, mpirun, srun on a one-node Slurm, horovodrun over SSH to hostA and hostB,
an elastic run over SSH), a fault (SIGKILL, SIGSTOP, an exception or a native crash in a worker, SIGKILL of runner
itself, SIGTERM to every process, a full disk, a kill inside a checkpoint write, a lost host), a moment (a step,
validation, a save, an elastic reset, the final report) and sometimes a second fault in the rerun; runs a tiny
ResNet-18 on synthetic data through runner, strikes, waits, reruns the same command, and checks what
rn50kit/reliability/campaign_trial.py says. Needs the services of tools/ci_services.sh (sshd on hostA/hostB,
Slurm, Open MPI). Each trial's result is kept in OUT/results/SEED.json (a rerun of the campaign skips those
done); the report is OUT/report.json and OUT/report.md, printed at the end.
"""
import argparse
import json
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rn50kit.reliability import campaign_plan, campaign_report, campaign_runs, campaign_trial  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the campaign's folder (results, references, report)")
    parser.add_argument("--seed", type=int, default=1, help="the campaign's seed (default 1)")
    parser.add_argument("--trials", type=int, default=100, help="trials drawn (default 100)")
    parser.add_argument("--covering", action="store_true",
                        help="instead: a few trials that strike under every launcher and with every fault once")
    parser.add_argument("--replay", type=int, metavar="SEED", help="run only the trial of SEED (a report's seed)")
    parser.add_argument("--report", action="store_true",
                        help="only write the report of the trials done so far (a campaign still running)")
    parser.add_argument("--stall-timeout", type=int, default=20, help="each run's --stall-timeout (default 20)")
    parser.add_argument("--margin", type=int, default=60,
                        help="seconds beyond the stall timeout a faulted run may take to end (default 60)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.stall_timeout < 1 or args.margin < 0:
        parser.error("--trials and --stall-timeout must be at least 1, --margin at least 0")
    return args


def newest_checkpoint_problem(workspace):
    """The newest complete checkpoint of ``workspace`` loads: its files whole (sizes and SHA-256 as saved) and its
    parameters read by MXNet; a problem line, or None (none saved yet is fine: the rerun starts again)."""
    import mxnet as mx

    from rn50kit.weights import checkpoint
    if not campaign_trial.had_checkpoint(workspace):
        return None
    problems = []
    latest = checkpoint.find_latest(os.path.join(workspace, "model"), problems=problems)
    if latest is None:
        return f"no complete checkpoint found among the state files left: {problems}"
    try:
        mx.nd.load(os.path.join(workspace, latest["files"]["params"]))
    except Exception as error:  # noqa: BLE001  any failure to read is the finding
        return f"the newest complete checkpoint {latest['state_path']} does not load: {error}"
    return None


def trials(args):
    if args.replay is not None:
        return [campaign_plan.draw(args.replay)]
    if args.covering:
        return campaign_plan.covering_set(args.seed)
    return [campaign_plan.draw(seed) for seed in campaign_plan.trial_seeds(args.seed, args.trials)]


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    setup = campaign_runs.Setup(ROOT, stall_timeout=args.stall_timeout, margin=args.margin,
                                checkpoint_check=newest_checkpoint_problem,
                                records=os.path.abspath(os.path.join(args.out, "digits")))
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    results = []
    for trial in trials(args):
        path = os.path.join(args.out, "results", f"{trial.seed}.json")
        if os.path.exists(path) and args.replay is None:
            with open(path) as f:
                results.append(json.load(f))
            continue
        if args.report:
            continue
        print(f"fault_campaign: {trial.describe()}", flush=True)
        result = campaign_trial.run_trial(setup, trial, os.path.join(args.out, "trials", str(trial.seed)))
        print(f"fault_campaign:   {'survived' if result['survived'] else 'FAILED: ' + '; '.join(result['problems'])}",
              flush=True)
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".tmp", path)
        results.append(result)
    command = "python tools/fault_campaign.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    replay = f"python tools/fault_campaign.py --out {shlex.quote(args.out)} --replay {{seed}}"
    report = campaign_report.summarize(results, command, replay)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = campaign_report.table(report)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if report["survived"] == report["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
