"""The training loop's parts (optimizers, mixed precision, collectives over Horovod's ranks, stop signals) and the
steps of train.py's run, a module each: configure (its RunConfig, the defaults of this machine and the scored
checkpoint filled in), worker (its place and devices), start_checks (refusals before the start), announce
(warnings and the header line), run_record (RunInfo, resolved configs), workspace, seeds, network, epoch_data and
elastic_setup (the training data and an elastic run's driver), run_modes (scoring, prediction, --test-io, the run's
end). Checkpoints are rn50kit.weights'."""
