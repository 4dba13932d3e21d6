"""tools/bench_step_parts.py on ResNet-18: every part timed both ways, and the check that both ways compute the same
thing passes, and fails when they do not."""
import json

import bench_step_parts
import pytest

pytestmark = pytest.mark.slow  # runs the benchmark tool on a ResNet-18: seconds a test

TINY = ["--num-layers", "18", "--rounds", "1", "--iters", "1", "--min-ms", "0"]


def test_every_part_is_timed_both_ways_and_agrees(tmp_path, capsys):
    out = tmp_path / "parts.json"
    assert bench_step_parts.main(TINY + ["--json", str(out)]) == 0
    numbers = json.loads(out.read_text())
    assert numbers["checks_passed"] and numbers["model"] == "resnet18_v1.5"
    parts = numbers["parts"]
    assert set(parts) == set(bench_step_parts.PARTS)
    assert set(parts["optimizer"]) == {"SGD update", "LARS update", "LAMB update"}
    assert len(parts["ema"]) == 3 and len(parts["stats"]) == 1
    for items in parts.values():
        for name, item in items.items():
            assert item["check"]["passed"], (name, item["check"])
            for way in bench_step_parts.WAYS:
                assert item[way]["median"] > 0 and item[way]["min"] <= item[way]["median"] <= item[way]["max"]
                assert len(item[way]["rounds"]) == 1 and item[way]["calls_a_round"] >= 1
            assert item["ratio"] == item["reference"]["median"] / item["ours"]["median"]
    # ResNet-18 v1.5: 20 BatchNorm layers, 2 statistics each
    assert "keep, 40 statistics, a copy each" in parts["stats"]
    printed = capsys.readouterr().out
    assert printed.count("check: ") == 7 and "FAILED" not in printed


def test_a_reference_that_computes_something_else_fails_the_check(tmp_path, monkeypatch, capsys):
    """A per-array EMA with another decay: the timings would compare two computations, so the run fails."""
    def other_decay(self):
        for name, p in self.params.items():
            self.shadow[name][:] = 0.5 * self.shadow[name] + 0.5 * p.data().astype("float32")
    monkeypatch.setattr(bench_step_parts.PerArrayEMA, "update", other_decay)
    out = tmp_path / "parts.json"
    assert bench_step_parts.main(TINY + ["--parts", "ema", "--json", str(out)]) == 1
    numbers = json.loads(out.read_text())
    assert not numbers["checks_passed"] and set(numbers["parts"]) == {"ema"}
    assert not any(item["check"]["passed"] for item in numbers["parts"]["ema"].values())
    assert "FAILED" in capsys.readouterr().out
