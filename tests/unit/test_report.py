"""report: per-class results round trip and are drawn; a benchmark JSON is not a run report."""
import json
import os
import subprocess
import sys
import cv2
import numpy as np
import pytest
from rn50kit.reporting import report as reports
from conftest import ROOT, venv_env


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


@pytest.mark.parametrize("classes", [3, reports.PNG_MATRIX_MAX + 5])
def test_confusion_png_and_plot_report(tmp_path, classes):
    rng = np.random.RandomState(1)
    confusion = rng.randint(0, 4, size=(classes, classes)) + np.diag(np.full(classes, 20))
    report = reports.Report("resnet", 1, [], {"val.top1": [0.5, 0.8]})
    report.add_per_class(confusion, 2, [f"class {i}" for i in range(classes)])
    path = str(tmp_path / "report.json")
    report.save(path)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_report.py"), path], env=venv_env(),
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    png = str(tmp_path / "report-confusion.png")
    assert png in result.stdout.splitlines()
    image = cv2.imread(png)
    assert image is not None and image.shape[0] > 200 and image.std() > 0


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
    assert "the last epoch's 3 timed iteration(s): its first 20 are left out" in run.summary()
