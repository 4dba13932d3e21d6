"""The vocabulary every command shares, without MXNet: the data backends' table, the --help format, the run rules,
ImageNet's class names."""
