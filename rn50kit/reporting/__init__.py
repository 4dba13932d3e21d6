"""The outputs of a run, without MXNet: live progress, the JSON-lines log, the JSON report, the MLPerf log."""
