"""The run machinery: a run's directory and its lock (`rundir`), its checkpoints (`checkpoint`: orbax, checksummed,
verified before a resume) and its metrics files and plots (`metrics`). `jaxgrpo.train`'s driver writes them;
`jaxgrpo.evaluation.runs` reads a run back."""
