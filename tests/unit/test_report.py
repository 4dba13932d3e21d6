"""report: per-class results round trip; a benchmark JSON is not a run report (the drawings, by plot_report.py's
process: e2e/test_plot_report.py)."""
import json

import numpy as np
import pytest

from rn50kit.reporting import report as reports


def test_per_class_results_and_report_round_trip(tmp_path):
    confusion = np.array([[5, 1, 0], [2, 3, 0], [0, 0, 0]])
    per_class = reports.per_class_results(confusion, ["cat", "dog", "zebra"], 4)
    assert per_class["samples"] == [6, 5, 0] and per_class["correct"] == [5, 3, 0]
    assert per_class["top1"] == [5 / 6, 3 / 5, None]  # a class without validation images has no top-1
    assert per_class["confused_pairs"] == [[1, 0, 2], [0, 1, 1]]
    assert per_class["confusion"] == confusion.tolist()
    report = reports.Report("resnet", 1, ["x"], {"val.top1": [0.7]}, info={"class_names": ["cat", "dog", "zebra"]})
    report.add_per_class(confusion, 4)
    report.save(str(tmp_path / "r.json"))
    loaded = reports.Report.load(str(tmp_path / "r.json"))
    assert loaded.per_class == json.loads(json.dumps(per_class))
    summary = loaded.summary()
    assert "dog 0.600 (3/5)" in summary and "dog -> cat x2" in summary


def test_report_py_says_a_benchmark_json_is_not_a_run_report_and_which_iterations_its_speed_covers(tmp_path,
                                                                                                  monkeypatch, capsys):
    """Found by the second newcomer walk (issue 26)."""
    import json

    from rn50kit.reporting import report
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"model": "resnet18_v1.5", "ngpus": [1], "bs": [8], "metric_keys": ["x"],
                                 "metrics": {}}))
    monkeypatch.setattr("sys.argv", ["report.py", str(sweep)])
    with pytest.raises(SystemExit) as end:
        report.main()
    assert "is a benchmark.py result (a sweep), not a run's report" in str(end.value)
    run = report.Report("resnet18_v1.5", 1, ["train.py"])
    run.add_epoch("train", durations=[0.1] * 23, batch_size=8, loss=1.0)
    assert "Train speed" in run.summary() and "(last epoch, 3 timed iteration(s))" in run.summary()
