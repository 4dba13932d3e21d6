"""What runner's launch check needs of MXNet without loading it (hardware/mxnet_answers.py): answers read from the
cache, asked again whenever it cannot be trusted (the asking Python itself: tests/e2e/test_mxnet_answers_asked.py)."""
import json

import pytest

from rn50kit.hardware import mxnet_answers
from support.runs import TINY_RUN, configured


@pytest.fixture
def cached(tmp_path):
    """A cache holding TINY_RUN's network (sizes of another network: the cache is trusted as it is)."""
    path = tmp_path / "cached" / "network-sizes.json"
    path.parent.mkdir()
    name = mxnet_answers.network_key(configured(TINY_RUN))
    path.write_text(json.dumps({name: {"parameters": 13, "activations": 17}}))
    return path


def test_a_cached_network_is_not_measured_again_and_another_one_is(cached, tmp_path, monkeypatch):
    path = tmp_path / "network-sizes.json"
    path.write_text(cached.read_text())
    asked = []
    monkeypatch.setattr(mxnet_answers, "ask", lambda question, argv: asked.append(argv) or
                        {"parameters": 7, "activations": 11})
    assert mxnet_answers.network_sizes(configured(TINY_RUN), TINY_RUN, path=str(path)) == (13, 17)
    assert asked == []
    other = TINY_RUN + ["--num-classes", "100"]
    assert mxnet_answers.network_sizes(configured(other), other, path=str(path)) == (7, 11)
    assert asked == [other] and len(json.loads(path.read_text())) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "{KEY: {\"parameters\": -1, \"activations\": 5}}",
                                     "{KEY: {\"parameters\": \"11\", \"activations\": 5}}"])
def test_a_damaged_cache_is_measured_again_and_rewritten(content, tmp_path, monkeypatch):
    path = tmp_path / "network-sizes.json"
    path.write_text(content.replace("KEY", json.dumps(mxnet_answers.network_key(configured(TINY_RUN)))))
    monkeypatch.setattr(mxnet_answers, "ask", lambda question, argv: {"parameters": 3, "activations": 5})
    assert mxnet_answers.network_sizes(configured(TINY_RUN), TINY_RUN, path=str(path)) == (3, 5)
    assert list(json.loads(path.read_text()).values()) == [{"parameters": 3, "activations": 5}]


def test_a_cache_that_cannot_be_written_still_gives_the_sizes(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(mxnet_answers, "ask", lambda question, argv: {"parameters": 3, "activations": 5})
    unwritable = str(tmp_path / "file" / "sizes.json")
    assert mxnet_answers.network_sizes(configured(TINY_RUN), TINY_RUN, path=unwritable) == (3, 5)


def test_the_key_changes_with_the_network_and_not_with_the_rest_of_the_run():
    base = mxnet_answers.network_key(configured(TINY_RUN))
    other_run = ["--batch-size", "8", "--lr", "0.1", "--num-epochs", "3"]
    assert base == mxnet_answers.network_key(configured(TINY_RUN + other_run))
    for change in (["--num-layers", "34"], ["--image-shape", "3,64,64"], ["--num-classes", "5"],
                   ["--input-layout", "NHWC", "--conv-layout", "NHWC"]):
        assert mxnet_answers.network_key(configured(TINY_RUN + change)) != base, change




def test_the_fused_batchnorm_answer_is_kept_per_mxnet_build(tmp_path, monkeypatch):
    path = str(tmp_path / "answers.json")
    asked = []
    monkeypatch.setattr(mxnet_answers, "ask", lambda question, argv: asked.append(question) or {"fused": True})
    assert mxnet_answers.nvidia_fused_batchnorm(path) is True and mxnet_answers.nvidia_fused_batchnorm(path) is True
    assert asked == ["nvidia_fused_batchnorm"]  # once
    monkeypatch.setattr(mxnet_answers, "mxnet_build", lambda: ["/another/mxnet/__init__.py", 1])
    monkeypatch.setattr(mxnet_answers, "ask", lambda question, argv: asked.append(question) or None)
    assert mxnet_answers.nvidia_fused_batchnorm(path) is False  # another MXNet, which cannot tell: no fused ops
    assert asked == ["nvidia_fused_batchnorm"] * 2


def test_runner_s_check_of_a_load_file_asks_once_per_version_of_the_file(tmp_path, monkeypatch):
    """A --load file with no state file beside it, where MXNet is not loaded (runner's process): read by a Python
    that imports train, once for the check of the flags and the scoring settings' check, again once it changes."""
    import sys

    from rn50kit.weights import checkpoint
    path = tmp_path / "model-best.params"
    path.write_bytes(b"not a parameter file")
    asked = []
    monkeypatch.delitem(sys.modules, "mxnet", raising=False)
    monkeypatch.setattr(mxnet_answers, "ask", lambda question, argv: asked.append((question, argv)) or
                        {"problem": f"{argv[0]} is damaged or not a parameter file (MXNet: ...)"})
    for _ in range(2):
        with pytest.raises(checkpoint.CheckpointError, match="is damaged or not a parameter file"):
            checkpoint.check_loadable(str(path))
    assert asked == [("params_problem", [str(path)])]
    path.write_bytes(b"another file, longer than the first")
    monkeypatch.setattr(mxnet_answers, "ask", lambda question, argv: asked.append((question, argv)) or
                        {"problem": None})
    checkpoint.check_loadable(str(path))
    assert len(asked) == 2
