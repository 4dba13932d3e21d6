"""The steadiness rule the benchmark tools warm up by (rn50kit/common/steady.py), on made-up step times: a step that
still speeds up after its first steps is not steady, one that has levelled off is, noise within the tolerance does
not hold the warm-up back and a step that never levels off is said so at the cap."""
import itertools

from rn50kit.common import steady

# PyTorch's float32 training step in issue 44: 3.89 images/s after one warm-up step, 4.95 after three (batch 16)
SLOW_START = [16 / 3.0, 16 / 3.89, 16 / 4.3, 16 / 4.7, 16 / 4.95, 16 / 4.97, 16 / 4.95, 16 / 4.96, 16 / 4.95,
              16 / 4.96, 16 / 4.95]


def test_a_step_still_speeding_up_is_not_steady():
    assert not steady.steady(SLOW_START[:6])  # medians 4.11 s then 3.40 s: 17 % apart
    assert not steady.steady(SLOW_START[:7])
    assert not steady.steady(SLOW_START[:8])  # 3.40 s then 3.23 s: 5.2 % apart, above the 5 % tolerance


def test_steady_once_the_last_two_windows_agree():
    assert steady.settled_after(SLOW_START) == 9  # steps 4-6 against 7-9: 3.23 s and 3.23 s
    assert steady.steady(SLOW_START[:9]) and steady.steady(SLOW_START)


def test_fewer_than_two_windows_are_never_steady():
    assert not steady.steady([1.0] * (2 * steady.WINDOW - 1))
    assert steady.steady([1.0] * (2 * steady.WINDOW))
    assert steady.settled_after([1.0] * 10) == 2 * steady.WINDOW


def test_the_median_lets_one_outlier_pass_and_the_tolerance_decides():
    assert steady.steady([1.0, 1.0, 1.0, 1.0, 5.0, 1.0])  # one slow step (another process) in a window
    assert steady.steady([1.0, 1.0, 1.0, 1.04, 1.04, 1.04], tolerance=0.05)
    assert not steady.steady([1.0, 1.0, 1.0, 1.06, 1.06, 1.06], tolerance=0.05)
    assert steady.steady([1.0, 1.0, 1.0, 1.06, 1.06, 1.06], tolerance=0.10)
    assert not steady.steady([1.0, 1.0, 1.0, 0.9, 0.9, 0.9], tolerance=0.05)  # faster counts as well as slower


def test_settled_after_honours_the_minimum_and_says_never():
    assert steady.settled_after([1.0] * 10, minimum=8) == 8
    assert steady.settled_after([2.0 ** -i for i in range(20)]) is None  # halves every step: never levels off


def fake_clock(step_times):
    """A clock and a step: each step() moves the clock on by the next of ``step_times``."""
    now = [0.0]
    times = iter(step_times)

    def step():
        now[0] += next(times)
    return (lambda: now[0]), step


def test_warm_up_stops_when_steady():
    clock, step = fake_clock(SLOW_START)
    result = steady.warm_up(step, clock=clock)
    assert result["settled"] and result["steps"] == 9
    assert [round(t, 6) for t in result["step_seconds"]] == [round(t, 6) for t in SLOW_START[:9]]
    assert steady.describe(result) == "steady after 9 warm-up steps"


def test_warm_up_runs_at_least_the_minimum():
    clock, step = fake_clock([1.0] * 20)
    assert steady.warm_up(step, minimum=11, clock=clock)["steps"] == 11


def test_warm_up_gives_up_at_the_cap_and_says_so():
    clock, step = fake_clock(2.0 ** -i for i in itertools.count())
    result = steady.warm_up(step, maximum=12, clock=clock)
    assert result == dict(result, steps=12, settled=False, window=steady.WINDOW, tolerance=steady.TOLERANCE)
    assert steady.describe(result).startswith("NOT steady after 12 warm-up steps")


def test_steady_since_ignores_a_plateau_the_step_time_left():
    plateau_then_faster = [2.0] * 10 + [1.0] * 10
    assert steady.settled_after(plateau_then_faster) == 6  # the warm-up rule stops on the plateau...
    assert steady.steady_since(plateau_then_faster) == 15  # ...the check of a finished warm-up does not
    assert steady.steady_since(SLOW_START) == 9
    assert steady.steady_since([1.0] * 6 + [2.0, 4.0]) is None  # slowing down at the end
