"""Evaluation and studies: a run read back (`runs`: its config, checkpoints and trained policy), a checkpoint or
base model evaluated on a task split with intervals (`policy_eval`, `jaxgrpo-eval`), and studies, a grid of
experiments over seeds collated with confidence intervals (`study`, `jaxgrpo-study`)."""
