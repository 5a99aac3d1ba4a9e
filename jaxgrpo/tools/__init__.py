"""The tools around the library: the command line (`cli`: every `jaxgrpo-*` console script), ahead-of-time
compilation for TPU topologies and its report (`compile`), calibrated against measured runs (`calibration`), and
export of a run's policy (`export`)."""
