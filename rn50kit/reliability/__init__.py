"""A run that fails says so, without MXNet: one run per workspace, faults told in one line, the stall watchdog, and
each worker's check that Horovod joined its launcher's world."""
