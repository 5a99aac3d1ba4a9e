"""GSPO-token (Zheng et al., 2025): GSPO's clipped sequence ratio, with each token's gradient its own.

s_i,t = sg[s_i] pi(y_t) / sg[pi(y_t)] has the value of the sequence ratio s_i, so with one advantage per
sequence the loss and gradient equal GSPO's; it leaves room for per-token advantages.
"""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "grpo"
    c.loss = "gspo_token"
    c.loss_kwargs = {"eps_low": 3e-4, "eps_high": 4e-4}
    c.aggregation = "seq_mean_token_mean"
    c.num_minibatches = 2  # the ratio only departs from 1 off-policy: two updates per batch
    c.run_dir = "runs/gspo_token"
    return c
