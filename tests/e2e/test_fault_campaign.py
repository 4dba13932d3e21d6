"""The fault campaign (tools/fault_campaign.py, issue 57): its plan, its report, and its covering set run end to end.

The covering set (--covering): a trial per launcher
(horovodrun, mpirun, srun, horovodrun over SSH, an elastic run), most with a second fault in the rerun, together
every fault kind once, each struck at a moment drawn from its seed. Every trial must survive as a user sees it
(rn50kit/reliability/campaign_trial.py: the run ended in bounded time with runner's line naming the fault, nothing
of it left, the newest complete checkpoint loads, the same command's rerun reports the unfaulted run's metrics); a
failure names the seed that replays it."""

import json
import os
import subprocess
import sys

import pytest

from rn50kit.reliability import campaign_plan, campaign_report
from support.cluster import need_mpi, need_slurm, need_ssh_hosts
from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end


def test_a_trial_is_its_seed_and_the_covering_set_covers():
    """Each trial replays from its seed alone (--replay), and the covering set strikes every launcher and fault."""
    seeds = campaign_plan.trial_seeds(7, 200)
    assert [campaign_plan.draw(s) for s in seeds] == [campaign_plan.draw(s) for s in seeds]
    drawn = [campaign_plan.draw(s) for s in seeds]
    for trial in drawn:
        for fault in (trial.fault, trial.second):
            if fault is None:
                continue
            assert fault.moment in campaign_plan.moments_for(fault.kind, trial.launcher)
            assert fault.kind in campaign_plan.faults_for(trial.launcher)
            assert fault.kind != "lost-host" or trial.launcher in campaign_plan.SSH_LAUNCHERS
    covering = campaign_plan.covering_set(1)
    assert [campaign_plan.draw(t.seed) for t in covering] == covering
    assert {t.launcher for t in covering} == set(campaign_plan.LAUNCHERS)
    kinds = [f.kind for t in covering for f in (t.fault, t.second) if f is not None]
    assert sorted(kinds) == sorted(campaign_plan.FAULTS)
    assert all(campaign_plan.second_reachable(t) for t in covering if t.second is not None)


def test_the_report_counts_struck_trials_and_names_each_failure_with_its_replay():
    def result(seed, launcher, kind, struck, survived, noticed, redone):
        return {"seed": seed, "trial": f"seed {seed}", "launcher": launcher, "survived": survived,
                "problems": [] if survived else ["the rerun failed"], "steps_redone": redone,
                "faults": [{"kind": kind, "struck": struck, "noticed_s": noticed}]}
    results = [result(1, "srun", "sigkill", True, True, 2.0, 3), result(2, "srun", "sigkill", True, False, 4.0, 6),
               result(3, "ssh", "lost-host", False, True, None, 0)]
    report = campaign_report.summarize(results, "python tools/fault_campaign.py --out x", "replay {seed}")
    assert (report["trials"], report["survived"], report["struck"], report["struck_survived"]) == (3, 2, 2, 1)
    assert report["by_fault_and_launcher"] == {"sigkill/srun": {"trials": 2, "survived": 1}}
    assert report["time_to_notice_s"] == {"median": 3.0, "max": 4.0}
    assert report["steps_redone"] == {"total": 9, "median": 3, "max": 6}
    assert report["failures"] == [{"seed": 2, "trial": "seed 2", "problems": ["the rerun failed"],
                                   "replay": "replay 2"}]
    table = campaign_report.table(report)
    assert "| sigkill | - | - | 1/2 | - | - |" in table and "(`replay 2`)" in table


def test_the_covering_set_strikes_every_launcher_and_fault_and_each_trial_survives(tmp_path):
    need_mpi()
    need_slurm()
    need_ssh_hosts()
    out = tmp_path / "campaign"
    command = [sys.executable, os.path.join(ROOT, "tools", "fault_campaign.py"), "--covering", "--seed", "1",
               "--stall-timeout", "15", "--margin", "120", "--out", str(out)]  # a busy CI machine's teardown
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S * 2,
                            stdin=subprocess.DEVNULL)
    assert (out / "report.json").exists(), result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    results = [json.loads(p.read_text()) for p in (out / "results").glob("*.json")]
    assert {r["launcher"] for r in results} == set(campaign_plan.LAUNCHERS)
    assert {f["kind"] for r in results for f in r["faults"] if f["struck"]} == set(campaign_plan.FAULTS), results
    assert report["trials"] == len(campaign_plan.COVERING) and report["faults_struck"] == len(campaign_plan.FAULTS)
    assert report["failures"] == [], campaign_report.table(report)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
