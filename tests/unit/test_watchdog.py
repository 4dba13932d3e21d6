"""watchdog: an engine wait told from a collective one, and a silent peer named before this rank's own wait."""
import json
import sys
import time

import pytest

from support.processes import HANG_S, wait_until

# --- the watchdog's account of a stall (in process) -----------------------------------------------------------

def test_a_read_blocked_on_mxnets_engine_is_an_engine_wait():
    """The loop's loss read (fit.mean_loss) waits for the engine, which waits for the step's allreduce when a peer
    stopped: a wait, not this rank's own stall (the frames are MXNet's, not the kit's Distributed or Horovod)."""
    import threading

    import mxnet as mx

    from rn50kit.reliability import watchdog

    release = threading.Event()

    class Hold(mx.operator.CustomOp):  # an engine operation that ends when the test says so
        def forward(self, is_train, req, in_data, out_data, aux):
            release.wait(HANG_S)
            self.assign(out_data[0], req[0], in_data[0])

        def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
            pass

    @mx.operator.register("rn50_test_hold")
    class HoldProp(mx.operator.CustomOpProp):
        def create_operator(self, ctx, shapes, dtypes):
            return Hold()

    held = mx.nd.Custom(mx.nd.ones(3), op_type="rn50_test_hold")  # queued: the engine holds it
    reader = threading.Thread(target=held.asnumpy)
    reader.start()
    try:
        wait_until(lambda: not reader.is_alive() or
                   watchdog.where(sys._current_frames().get(reader.ident))[1] == "engine",
                   "the reader to block in MXNet's read", 60)
        assert reader.is_alive()  # still blocked: the engine has not run the held operation
    finally:
        release.set()
        reader.join(HANG_S)
    assert watchdog.where(sys._getframe())[1] is None  # the test's own frame: no wait


def test_the_watchdog_names_a_silent_peer_before_its_own_wait(tmp_path, monkeypatch):
    from rn50kit.reliability import faults, watchdog

    def write(rank, **fields):
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(dict(rank=rank, host=f"node{rank}", pid=100 + rank,
                                                                    period=1.5, **fields)))

    def fire(waiting):
        (tmp_path / "rank-0.json").unlink(missing_ok=True)
        monkeypatch.setattr(faults, "_record", {"rank": 0, "host": "node0", "pid": 100})
        monkeypatch.setattr(faults, "_path", str(tmp_path / "rank-0.json"))
        monkeypatch.setattr(watchdog.os, "_exit", lambda status: (_ for _ in ()).throw(SystemExit(status)))
        with pytest.raises(SystemExit):
            watchdog.Watchdog(15, 0).fire("fit.py:369 mean_loss", waiting, 16.0)
        return json.loads((tmp_path / "rank-0.json").read_text())

    now = time.time()
    write(1, alive=now - 60, where="fit.py:352 train_step", waiting=None)  # frozen (SIGSTOP): no heartbeat
    for waiting in ("engine", None, "collective"):
        record = fire(waiting)
        assert record["culprit"] == 1 and "rank 1 (host node1, pid 101) stalled: no sign of life" in record["failure"]
    write(1, alive=time.time(), where="fit.py:352 train_step", waiting=None)  # alive, stuck in its own work
    for waiting, culprit in (("engine", 1), ("collective", 1), (None, 0)):
        assert fire(waiting)["culprit"] == culprit, waiting
    write(1, alive=time.time(), where="fit.py:369 mean_loss", waiting="engine")  # waiting too
    assert fire("engine")["culprit"] == 0  # the engine waits for this rank's own device
    assert fire("collective")["culprit"] is None  # nothing tells which rank


def test_a_rank_frozen_before_its_first_period_has_a_heartbeat_to_go_stale(tmp_path, monkeypatch):
    """The watchdog's first heartbeat is at its start, not one period later: a rank stopped in its first steps
    (the fault campaign, seed 100031: srun, step 1) is named by the others as silent, not as 'a rank stalled'."""
    import threading

    from rn50kit.reliability import faults, watchdog
    from support.processes import wait_until
    monkeypatch.setattr(faults, "_record", {"rank": 0, "host": "node0", "pid": 100})
    monkeypatch.setattr(faults, "_path", str(tmp_path / "rank-0.json"))
    done = threading.Event()
    main = threading.Thread(target=done.wait)
    main.start()
    try:
        dog = watchdog.Watchdog(50, 0, main_thread=main)  # a period of 5 s
        started = time.time()
        dog.start()
        record = wait_until(lambda: (tmp_path / "rank-0.json").exists() and
                            json.loads((tmp_path / "rank-0.json").read_text()), "the first heartbeat", 4)
        assert started <= record["alive"] < started + dog.period and record["period"] == dog.period
        assert faults.silent_ranks(now=record["alive"] + 3 * dog.period + 1, folder=str(tmp_path))[0]["rank"] == 0
    finally:
        done.set()
        main.join()
