"""Seeded fuzzing of record files: a few hundred damaged copies of a small real .rec/.idx (bit flips, truncation at
and inside records, header length and flag fields, labels, index offsets past the end or off a record, an index
from another file, index lines), each through tools/check_dataset.py and through train.py's start-up checks and
its validation and training iterators (in-process: a process per case would take an hour). Each must end in a
correct result or one line naming the file and the record: never a
traceback, a hang, a signal death or a label other than the file's. The cases are judged against record_fuzz's
own reading of the bytes."""
import collections
import json
import os
import subprocess
import sys

import pytest

from support.datasets import photo, write_record_file
from support.processes import HANG_S, ROOT, WORKERS, venv_env
from support.workers import record_fuzz

pytestmark = pytest.mark.slow  # a few hundred cases, two processes

CASES = 400
SEED = 48
NUM_CLASSES = 3


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    base = write_record_file(str(folder / "base"), [photo(i, (24, 32)) for i in range(12)],
                             [i % NUM_CLASSES for i in range(12)])
    other = write_record_file(str(folder / "other"), [photo(100 + i, (40, 56)) for i in range(10)],
                              [i % NUM_CLASSES for i in range(10)])
    assert record_fuzz.expected(open(base[0], "rb").read(), open(base[1]).read(), NUM_CLASSES)[0] == "good"
    made = record_fuzz.make_cases(str(folder), *base, other[1], CASES, SEED, NUM_CLASSES)
    with open(folder / "cases.json", "w") as f:
        json.dump(made, f)
    return str(folder / "cases.json"), made


def run_all(mode, cases_path, count):
    """Every case through ``mode`` in as few processes as it takes: one, unless a case kills it (then that case is
    a finding and the next process starts after it). {case: result}."""
    env = venv_env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), os.path.join(ROOT, "tools"), env["PYTHONPATH"]])
    results, start = {}, 0
    while start < count:
        done = subprocess.run([sys.executable, os.path.join(WORKERS, "record_fuzz.py"), mode, cases_path,
                               str(start), str(NUM_CLASSES)], env=env, capture_output=True, text=True,
                              timeout=HANG_S, cwd=ROOT)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        for line in lines:
            if "done" in line:
                results[line["done"]] = line
        started = [line["start"] for line in lines if "start" in line]
        if done.returncode == 0 and len(results) == count:
            break
        last = started[-1] if started else start
        results[last] = {"died": done.returncode, "stderr": done.stderr[-2000:]}
        start = last + 1
    return results


def names_file_and_record(message, case):
    """The file, and the record or index line (an empty file has none)."""
    return (case["rec"] in message or case["idx"] in message) and \
        ("record" in message or "line" in message or f"{case['rec']} is empty" in message)


def judge_check(case, result):
    """Why tools/check_dataset.py's result on ``case`` is wrong, or None."""
    expected = case["expected"]
    if "status" not in result:
        return f"no result: {result}"
    if "Traceback" in result["output"] or result["status"] not in (0, 1):
        return f"status {result['status']}: {result['output'][-500:]}"
    if expected[0] == "bad":
        errors = [line for line in result["output"].splitlines() if line.startswith("error:")]
        listed = "record" in result["output"] or "index line" in result["output"]
        return None if result["status"] == 1 and errors and listed else f"passed a bad file ({expected[1]})"
    if result["status"] == 1 and not expected[2] and not refused_by_dali_only(case, result["output"]):
        return f"failed a good file: {result['output'][-500:]}"
    return None


def refused_by_dali_only(case, output):
    """Whether the check's only errors are images DALI's decoder refuses (and OpenCV decodes) in records changed
    here: decoders differ on damaged bytes, and the check asks both."""
    listed, section = [], None
    for line in output.splitlines():
        if not line.startswith("  "):
            section = line if line.startswith("error:") else None
        elif section:
            listed.append((section, line))
    return bool(listed) and all(section.startswith("error: undecodable image:") and "DALI's decoder" in line and
                                int(line.split()[1]) in case["changed_images"] for section, line in listed)


def judge_reader(case, result, split):
    """Why the training or validation iterator's result on ``case`` is wrong, or None."""
    expected = case["expected"]
    if expected[0] == "good" and split == "train":
        expected = [expected[0], sorted(expected[1]), expected[2]]  # a shuffled epoch
    if "error" in result:
        if "\n" in result["error"] or not names_file_and_record(result["error"], case):
            return f"error not one line naming the file and record: {result['error'][:300]}"
        decoder = "does not decode" in result["error"] and any(f"record {key} " in result["error"]
                                                              for key in case["changed_images"])
        # (decoders differ on damaged bytes: DALI's refuses some that OpenCV reads, naming a record changed here)
        return None if expected[0] == "bad" or expected[2] or decoder else \
            f"refused a good file: {result['error'][:300]}"
    if "labels" not in result:
        return f"no result: {str(result)[:1500]}"
    if expected[0] == "bad":
        return f"read a bad file ({expected[1]}): labels {result['labels']}"
    return None if result["labels"] == expected[1] else f"labels {result['labels']}, the file's {expected[1]}"


def test_damaged_record_files_end_in_a_result_or_one_line(cases):
    cases_path, made = cases
    findings, outcomes = [], collections.Counter()
    for mode in ("check", "val", "train"):
        results = run_all(mode, cases_path, len(made))
        for case in made:
            result = results.get(case["n"], {"missing": True})
            why = judge_check(case, result) if mode == "check" else judge_reader(case, result, mode)
            outcomes[mode, case["expected"][0], "refused" if result.get("status") == 1 or "error" in result else
                     "read"] += 1
            if why:
                findings.append(f"{mode} case {case['n']} ({case['kind']}): {why[:600]}")
    summary = ", ".join(f"{mode} {expected} {what}: {count}"
                        for (mode, expected, what), count in sorted(outcomes.items()))
    print(f"{len(made)} cases: {summary}")  # shown with -s: what the cases found
    assert not findings, f"{len(findings)} finding(s) in {len(made)} cases ({summary}):\n" + "\n".join(findings)
