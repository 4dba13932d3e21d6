"""stop_signals' one record, with real signals sent to this process: a stop kept during start-up makes the loop's
StopFlag start requested (once), a Ctrl-C asks to save and decides the exit status, a second one does not wait.
The processes' side (train.py saving at a step, exit statuses) is in tests/e2e/test_preemption.py."""
import signal

import pytest

from rn50kit.training import stop_signals


class OneProcess:
    """Distributed's sum for one rank: the values themselves."""

    def sum(self, values, name):
        return values


@pytest.fixture()
def record(monkeypatch, keep_signal_handlers):
    fresh = stop_signals.StopRecord()
    monkeypatch.setattr(stop_signals, "RECORD", fresh)
    return fresh


def test_a_stop_kept_during_start_up_is_taken_up_by_the_first_stop_flag_only(record):
    stop_signals.keep_early_stops()
    signal.raise_signal(signal.SIGTERM)  # kept: the process goes on
    assert record.pending == [signal.SIGTERM]
    stop_signals.catch_stop_signals()
    flag = stop_signals.StopFlag(OneProcess())
    assert flag.requested and flag.agreed_now()
    assert not stop_signals.StopFlag(OneProcess()).requested  # a later run in this process starts afresh
    assert not stop_signals.interrupted() and stop_signals.stop_cause() == "signal"


def test_ctrl_c_asks_to_save_and_a_second_one_does_not_wait(record):
    flag = stop_signals.StopFlag(OneProcess())
    assert flag.vote(True) and not flag.agreed
    signal.raise_signal(signal.SIGINT)
    assert flag.requested and flag.vote(True) and flag.agreed
    assert stop_signals.interrupted() and stop_signals.stop_cause() == "Ctrl-C (SIGINT)"
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)



def test_the_vote_carries_a_loss_that_is_not_finite(record):
    flag = stop_signals.StopFlag(OneProcess())
    assert not flag.vote(False) and flag.vote(True) and flag.votes == 2 and not flag.agreed
