"""tools/plot_report.py draws real PNGs from a report (the curves, the confusion matrix at both sizes); bad reports
give one error line; report.py's summary as a command."""
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from rn50kit.reporting import report as reports
from support.processes import ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes


def test_plots_one_png_per_curve(tmp_path):
    report = tmp_path / "report.json"
    metrics = {"train.top1": [0.2, 0.5, 0.7], "val.top1": [0.3, 0.6, 0.8], "train.loss": [2.0, 1.0, 0.5],
               "val.loss": [1.9, 1.1, 0.6], "train.lr": [0.1, 0.05, 0.0], "val.top5": [0.6, 0.9, 1.0]}
    report.write_text(json.dumps({"model": "m", "ngpus": 1, "total_duration": 1, "cmd": [], "metrics": metrics}))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_report.py"), str(report)],
                            env=venv_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for key in ("top1", "top5", "loss", "lr"):
        image = cv2.imread(str(tmp_path / f"report-{key}.png"))
        assert image is not None and image.shape[0] > 100 and image.std() > 0, key
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_report.py"), str(bad)],
                            env=venv_env(), capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "error:" in result.stderr


def test_report_summary_names_the_best_epoch(tmp_path):
    report = tmp_path / "report.json"
    metrics = {"val.top1": [0.3, 0.9, 0.8], "train.total_ips": [10.0, 20.0, 30.0]}
    report.write_text(json.dumps({"model": "m", "ngpus": 2, "total_duration": 12, "cmd": [], "metrics": metrics}))
    result = subprocess.run([sys.executable, "-m", "rn50kit.reporting.report", str(report)], cwd=ROOT,
                            env=venv_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Validation top-1: 0.8000 (best 0.9000, epoch 2)" in result.stdout
    assert "3 epoch(s)" in result.stdout and "30.0 images/s" in result.stdout


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
