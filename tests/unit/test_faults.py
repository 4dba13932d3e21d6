"""faults: runner names the first real fault of a run, not its teardown."""
import json


# --- runner's reading of the workers' records (no processes) -------------------------------------------------

def test_runner_names_the_first_real_fault_not_the_teardown(tmp_path):
    from rn50kit.reliability import faults

    def write(rank, **fields):
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(dict(rank=rank, host=f"node{rank}", pid=100 + rank,
                                                                    **fields)))
    write(0, kind="teardown", failure="MXNetError: Horovod has been shut down", failed=10.0, alive=9.0)
    write(1, alive=9.5)
    # rank 1 died of SIGKILL: no failure of its own; the launcher saw it end first
    assert faults.summarize(str(tmp_path), (1, 137)).startswith(
        "rank 1 (host node1, pid 101) was killed by SIGKILL (exit status 137): ")
    # an error recorded by any rank wins over the launcher's order and over teardown
    write(1, kind="error", failure="RuntimeError: boom", failed=11.0)
    assert faults.summarize(str(tmp_path), (0, 1)).startswith(
        "rank 1 (host node1, pid 101) failed: RuntimeError: boom (its message is above)")
    # a teardown whose worker saw a silent peer (Gloo's timeout came before the watchdog)
    write(1, alive=1.0)
    write(0, kind="teardown", failure="MXNetError: Horovod has been shut down", failed=40.0,
          silent=[dict(rank=1, host="node1", pid=101, alive=1.0, silent_for=39.0)])
    assert faults.summarize(str(tmp_path), (0, 1)).startswith(
        "rank 1 (host node1, pid 101) stalled: no heartbeat for 39 s")
    assert faults.summarize(str(tmp_path / "none"), None) is None
    assert faults.signal_name(137) == "SIGKILL" and faults.signal_name(-15) == "SIGTERM"
    assert faults.signal_name(1) is None
