"""The fault campaign's seeded covering set run end to end (tools/fault_campaign.py --covering, issue 57), by hand:
`python -m pytest tests/campaign_covering.py` (not named test_*.py, so the suite does not collect it: it has not
yet passed end to end on a quiet machine; tests/e2e/test_fault_campaign.py checks the plan and the report). Needs
the services of tools/ci_services.sh."""
import json
import os
import subprocess
import sys

from rn50kit.reliability import campaign_plan, campaign_report
from support.cluster import need_mpi, need_slurm, need_ssh_hosts
from support.processes import HANG_S, ROOT, venv_env


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
