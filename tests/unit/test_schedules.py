"""schedules against their formulas: LR schedules, the poly schedule, the mlperf LR points, FFCV's progressive
sizes."""
import pytest

from rn50kit.config import lr_schedules
from rn50kit.config import recipe as recipes


def test_schedules_match_their_formulas():
    cos = lr_schedules.get_schedule("cosine", 1.0, 10, warmup_epochs=2)
    assert cos(1.0) == pytest.approx(0.5) and cos(2.0) == pytest.approx(1.0)
    assert cos(6.0) == pytest.approx(0.5) and cos(10.0) == pytest.approx(0.0, abs=1e-12)
    step = lr_schedules.get_schedule("step", 1.0, 90, warmup_epochs=0, steps=[30, 60, 80], factor=0.1)
    assert [step(e) for e in (0, 29.9, 30, 65, 85)] == pytest.approx([1, 1, 0.1, 0.01, 0.001])
    poly = lr_schedules.get_schedule("poly", 1.0, 10, power=2)
    assert poly(5) == pytest.approx(0.25)
    linear = lr_schedules.get_schedule("linear", 1.0, 10, warmup_epochs=0)
    assert linear(2.5) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="unknown LR schedule"):
        lr_schedules.get_schedule("exp", 1.0, 10)


# ---- the poly schedule and the mlperf recipe -----------------------------------------------------------------------
def test_poly_schedule_with_end_lr_equals_its_formula():
    base, end, warmup, epochs, power = 10.5, 1e-4, 2.0, 37, 2.0
    schedule = lr_schedules.get_schedule("poly", base, epochs, warmup, power=power, final_lr=end)

    def formula(epoch):  # linear warmup from 0, then end + (base - end) (1 - t)^power over the epochs left
        if epoch < warmup:
            return base * epoch / warmup
        return end + (base - end) * (1 - (epoch - warmup) / (epochs - warmup)) ** power
    for epoch in [0.0, 0.5, 1.0, 1.999, 2.0, 3.25, 10.0, 19.5, 30.0, 36.9, 37.0]:
        assert schedule(epoch) == pytest.approx(formula(epoch), rel=1e-12, abs=1e-15), epoch
    assert schedule(19.5) == pytest.approx(end + (base - end) / 4)
    assert schedule(37.0) == pytest.approx(end)


def test_mlperf_lr_from_mlcommons_points():
    points = recipes.RECIPES["mlperf"]["lr_points"]
    for batch, lr in [(1632, 7.4), (3200, 11.0), (3264, 10.5)]:
        assert recipes.points_lr(points, batch)[0] == lr  # a point's batch: its LR as it is
    lr, how = recipes.points_lr(points, 816)
    assert lr == pytest.approx(7.4 / 2 ** 0.5) and "1632 -> 7.4" in how and "sqrt(816/1632)" in how
    assert recipes.points_lr(points, 6528)[0] == pytest.approx(10.5 * 2 ** 0.5)  # nearest: 3264
    assert recipes.points_lr(points, 3230)[0] == pytest.approx(11.0 * (3230 / 3200) ** 0.5)  # nearest: 3200


def test_progressive_sizes_follow_ffcvs_plan():
    # rn50_88_epochs.yaml: min_res 160, max_res 192, start_ramp 65, end_ramp 76 (epochs from 0), multiples of 32
    plan = [lr_schedules.train_size(e, 160, 192, 65, 76) for e in range(88)]
    assert plan == [160] * 71 + [192] * 17  # interp(70) = 174.5 -> 160, interp(71) = 177.5 -> 192
    plan = [lr_schedules.train_size(e, 160, 192, 17, 20) for e in range(24)]  # rn50_24_epochs.yaml
    assert plan == [160] * 19 + [192] * 5
    assert [lr_schedules.train_size(e, 16, 32, 1, 3, step=8) for e in range(5)] == [16, 16, 24, 32, 32]
