"""The vocabulary every command shares, without MXNet: the data backends' table, shared flags and --help format,
the run rules, recipes and LR schedules, ImageNet's class names."""
