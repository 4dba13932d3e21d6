"""A fault campaign's report (tools/fault_campaign.py), from its trials' results: trials and survivals by launcher
and fault, the work redone (steps), the time to notice (median, max), and every failure with the seed that replays
it. JSON for machines, a Markdown table for people."""
import statistics

from rn50kit.reliability.campaign_plan import FAULTS, LAUNCHERS


def summarize(results, command, replay):
    """The report of ``results`` (campaign_trial.run_trial's dicts); ``command``: how the campaign was run;
    ``replay``: the command that replays one trial, with ``{seed}`` in it."""
    cells = {}
    struck = [r for r in results if any(f["struck"] for f in r["faults"])]  # the others' moment never came
    for result in struck:
        for kind in {f["kind"] for f in result["faults"] if f["struck"]}:
            cell = cells.setdefault(f"{kind}/{result['launcher']}", {"trials": 0, "survived": 0})
            cell["trials"] += 1
            cell["survived"] += bool(result["survived"])
    noticed = [f["noticed_s"] for r in results for f in r["faults"] if f["noticed_s"] is not None]
    redone = [r["steps_redone"] for r in results if "steps_redone" in r]
    return {
        "command": command,
        "trials": len(results),
        "survived": sum(bool(r["survived"]) for r in results),
        "struck": len(struck),
        "struck_survived": sum(bool(r["survived"]) for r in struck),
        "faults_struck": sum(f["struck"] for r in results for f in r["faults"]),
        "by_fault_and_launcher": cells,
        "steps_redone": {"total": sum(redone), "median": statistics.median(redone) if redone else None,
                         "max": max(redone, default=None)},
        "time_to_notice_s": {"median": round(statistics.median(noticed), 1) if noticed else None,
                             "max": round(max(noticed), 1) if noticed else None},
        "failures": [{"seed": r["seed"], "trial": r["trial"], "problems": r["problems"],
                      "replay": replay.format(seed=r["seed"])}
                     for r in results if not r["survived"]],
    }


def table(report):
    """The report as Markdown: survived/trials per fault (rows) and launcher (columns), of the trials whose faults
    struck, then the figures and the failures."""
    lines = ["| fault | " + " | ".join(LAUNCHERS) + " |", "|---|" + "---|" * len(LAUNCHERS)]
    for kind in FAULTS:
        row = []
        for launcher in LAUNCHERS:
            cell = report["by_fault_and_launcher"].get(f"{kind}/{launcher}")
            row.append(f"{cell['survived']}/{cell['trials']}" if cell else "-")
        lines.append(f"| {kind} | " + " | ".join(row) + " |")
    notice, redone = report["time_to_notice_s"], report["steps_redone"]
    lines += ["", f"Trials: {report['trials']}, survived: {report['survived']}; trials whose fault struck: "
              f"{report['struck']} (the others' moment never came), survived: {report['struck_survived']}; faults "
              f"struck: {report['faults_struck']}; time to notice: median {notice['median']} s, max {notice['max']} s; "
              f"work redone: {redone['total']} steps in all (median {redone['median']}, max {redone['max']} a "
              "trial).", ""]
    for failure in report["failures"]:
        lines.append(f"- {failure['trial']}: {'; '.join(failure['problems'])} (`{failure['replay']}`)")
    return "\n".join(lines)
