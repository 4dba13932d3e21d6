"""models.py's and the export tool's command lines: summary, bad input, the original CLI, ONNX export of
model_best."""
import os
import subprocess
import sys
import mxnet as mx
import pytest
import models
from conftest import ROOT, venv_env, parse_model_args, built

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_original_cli_and_num_classes():
    args = parse_model_args(["--arch", "resnextv15", "--num-layers", "101", "--num-groups", "32", "--num-classes", "7"])
    net = models.get_model_from_args(args)
    net.initialize()
    assert net.collect_params()["fc1_weight"].shape == (7, 2048)
    assert net.collect_params()["stage1_unit1_conv2_weight"].shape == (128, 4, 3, 3)  # 32 groups of 4
    assert models.model_name("resnetv1", 34) == "resnet34_v1"
    with pytest.raises(ValueError, match="unknown model"):
        models.get_model_from_args(parse_model_args(["--arch", "resnextv1", "--num-layers", "18"]))
    with pytest.raises(ValueError, match="--batchnorm-layout"):
        models.get_model_from_args(parse_model_args(["--conv-layout", "NCHW", "--batchnorm-layout", "NHWC"]))
    for name in models.list_models():
        net = models.get_model(name, num_classes=3)
        assert net.output._units == 3


@pytest.mark.slow
def test_summary_cli_and_bad_input():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "models.py"), "--summary", "--models", "resnet18_v1",
                          "--batch-sizes", "1", "--iters", "1"], capture_output=True, text=True, env=venv_env())
    assert run.returncode == 0, run.stderr
    row = run.stdout.strip().splitlines()[-1].split()
    assert row[0] == "resnet18_v1" and row[1] == "11,689,512" and abs(float(row[2]) - 1.81) < 0.01
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "models.py"), "--models", "resnet19"],
                         capture_output=True, text=True, env=venv_env())
    assert bad.returncode == 2 and "error: unknown model(s) resnet19" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_export_onnx_exports_model_best(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import shutil
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import export_onnx
    import models
    net = built(18, 32)
    net(mx.nd.zeros((1, 3, 32, 32)))
    prefix = str(tmp_path / "model")
    models.export(net, prefix, 1)
    shutil.copyfile(f"{prefix}-0001.params", f"{prefix}-best.params")
    onnx_file = export_onnx.export_onnx(prefix, "best", (3, 32, 32))
    assert onnx_file == f"{prefix}-best.onnx"
    assert export_onnx.compare_with_onnxruntime(prefix, "best", onnx_file, (3, 32, 32)) < 1e-4
