"""Peer coverage: each kernel of verl, TRL and tunix, and the jaxgrpo kernel and options that reproduce it.

Every row names one entry of a peer's own registry or configuration (verl's
`adv_estimator`, TRL's `GRPOConfig.loss_type`, tunix's `policy_loss_fn`, ...),
the jaxgrpo kernel that computes the same function, the keyword options that
make it equal, and, for a policy loss whose normalization the peer fixes, the
aggregation mode. A row without a kernel says so (`ours is None`) and why.

    jaxgrpo-kernels --peer verl        # the table, with what this build lacks
    jaxgrpo.catalog.peers.coverage("trl")

Option values are numbers, with two symbols for sizes that depend on the batch:
`"T"` is the padded completion length (`mask.shape[1]`, verl's default
`loss_scale_factor`, TRL's `max_completion_length` when completions are padded
to it) and `"N"` the number of rows (`mask.shape[0]`); `resolve_options`
replaces them. The options are the peer's defaults at the commit (or release)
it is pinned to (`Peer.pin`), or, where a row's note says so, a value the peer
recommends. Each row names in `differences` what jaxgrpo does differently on
purpose, e.g. the +-20 clamp of a log-ratio before exp, or a group of one
rollout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxgrpo.kernels import registry
from jaxgrpo.kernels.aggregation import AGGREGATION_MODES

#: Option values that stand for a size of the batch; see `resolve_options`.
SIZE_SYMBOLS = {
    "T": "the padded completion length, mask.shape[1]",
    "N": "the number of rows, mask.shape[0]",
}

#: Our kinds a row can name: the registry's, plus `aggregation` (a mode of
#: `jaxgrpo.aggregate`) and `function` (a public function of `jaxgrpo.kernels`).
ROW_KINDS = tuple(registry.KINDS) + ("aggregation", "function")


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer library and the source its rows were read from.

    Attributes:
      commit: the commit read, or None where the source read is a release
        whose commit could not be reached (`release` then names it).
      release: the released version read, if the source is a release.
      date: the date of that commit or release.
      files: the files read.
      source_note: how the source was reached, where it is not a plain commit.
    """

    name: str
    repository: str
    commit: str | None
    date: str
    files: tuple[str, ...]
    release: str | None = None
    source_note: str = ""

    def __post_init__(self):
        if self.commit is None and self.release is None:
            raise ValueError(f"{self.name}: a peer is pinned to a commit or to a release")

    @property
    def pin(self) -> str:
        """`commit 1dda039... (2026-08-22)` or `release 1.16.0 (2026-10)`: what the rows were read at."""
        what = f"commit {self.commit}" if self.commit else f"release {self.release}"
        return f"{what} ({self.date})"


@dataclasses.dataclass(frozen=True)
class PeerRow:
    """One peer kernel and the jaxgrpo kernel, options and aggregation that reproduce it.

    Attributes:
      peer_kind: the peer's own name for the setting (`adv_estimator`, `loss_type`, ...).
      peer_name: the value of that setting (`grpo`, `low_var_kl`, ...).
      kind: our kind (one of `ROW_KINDS`); None when we have no kernel for it.
      ours: our kernel's name (or aggregation mode, or function); None when missing.
      options: keyword options of our kernel that reproduce the peer's defaults.
      aggregation: the aggregation mode the peer applies to this loss, if it fixes one.
      aggregation_options: keyword options of `jaxgrpo.aggregate` for it.
      note: the conditions of the equality, or why the kernel is missing.
      differences: what jaxgrpo does differently on purpose, one sentence each:
        where the peer's value and ours can differ even with these options.
    """

    peer_kind: str
    peer_name: str
    kind: str | None
    ours: str | None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    aggregation: str | None = None
    aggregation_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""
    differences: tuple[str, ...] = ()

    def __post_init__(self):
        if (self.kind is None) != (self.ours is None):
            raise ValueError(f"{self.peer_name}: kind and ours are both set or both None")
        if self.kind is not None and self.kind not in ROW_KINDS:
            raise ValueError(f"{self.peer_name}: unknown kind {self.kind!r}; valid kinds: {', '.join(ROW_KINDS)}")
        if self.aggregation is not None and self.aggregation not in AGGREGATION_MODES:
            raise ValueError(f"{self.peer_name}: unknown aggregation mode {self.aggregation!r}")
        if isinstance(self.differences, str):
            raise ValueError(f"{self.peer_name}: differences is a tuple of sentences, not one string")


PEERS: dict[str, Peer] = {
    "verl": Peer(
        "verl", "verl-project/verl", "1dda039b9c6311889a9c9a26040677e1254814f9", "2026-08-22",
        ("verl/trainer/ppo/core_algos.py", "verl/trainer/config/actor/actor.yaml", "verl/trainer/config/ppo_trainer.yaml",
         "verl/utils/groupwise.py"),
        source_note="volcengine/verl moved to verl-project/verl.",
    ),
    "trl": Peer(
        "trl", "huggingface/trl", None, "2026-10",
        ("trl/trainer/grpo_config.py", "trl/trainer/grpo_trainer.py", "trl/trainer/utils.py"),
        release="1.16.0",
        source_note=("Read from the released package, the version jaxgrpo's bench and test extras pin; the "
                     "newest TRL commit reached, f2cd57710ae345ea6428ae95363267fcf38a3dc8 (2026-07-24, version "
                     "1.10.0.dev0), predates it."),
    ),
    "tunix": Peer(
        "tunix", "google/tunix", "c7d8950f12a9c55a976bf2e1a0d8b447d71c20b3", "2026-08-21",
        ("tunix/rl/algo_core.py", "tunix/rl/common.py", "tunix/rl/grpo/grpo_learner.py",
         "tunix/rl/grpo/dapo_learner.py", "tunix/rl/grpo/drgrpo_learner.py", "tunix/rl/ppo/ppo_learner.py"),
    ),
}


_POLICY_RATIO = "log(pi / pi_old)"
_REFERENCE_RATIO = "log(pi_ref / pi)"


def _unclamped(peer: str, log_ratio: str = _POLICY_RATIO) -> str:
    """The deliberate difference of a kernel that clamps a log-ratio where the peer does not."""
    return (f"jaxgrpo clamps {log_ratio} to +-20 before exp (MAX_LOG_RATIO); {peer} does not: "
            f"equal while |{log_ratio}| <= 20.")


def _one_rollout(peer: str, value: str) -> str:
    return f"A group of one rollout: {peer} gives {value}, jaxgrpo 0."


_EVERY_ROW = ("{peer} averages over every row, jaxgrpo over the rows with a token: equal unless a row is "
              "fully masked.")
_VERL_CLIP = dict(eps_low=0.2, eps_high=0.2)  # the actor's clip_ratio_low / clip_ratio_high (both 0.2)
_VERL_CLIP_C = 3.0  # the actor's clip_ratio_c, the dual clip's constant

_VERL = (
    # adv_estimator (ADV_ESTIMATOR_REGISTRY)
    PeerRow("adv_estimator", "gae", "token_advantage", "gae", dict(gamma=1.0, lam=1.0),
            note="algorithm.gamma, algorithm.lam. verl then whitens the advantages over the batch's tokens: "
                 "masked_whiten(advantages, mask); the returns are not whitened."),
    PeerRow("adv_estimator", "grpo", "advantage", "grpo", dict(std_ddof=1, eps=1e-6),
            note="norm_adv_by_std_in_grpo=True (default).",
            differences=(_one_rollout("verl", "r / (1 + eps)"),)),
    PeerRow("adv_estimator", "grpo (norm_adv_by_std_in_grpo=False)", "advantage", "dr_grpo",
            differences=(_one_rollout("verl", "r"),)),
    PeerRow("adv_estimator", "grpo_vectorized", "advantage", "grpo", dict(std_ddof=1, eps=1e-6),
            note="As grpo: verl no longer floors the group variance at eps (since 1cc810c).",
            differences=(_one_rollout("verl", "r / (1 + eps)"),)),
    PeerRow("adv_estimator", "rloo", "advantage", "rloo", differences=(_one_rollout("verl", "r"),)),
    PeerRow("adv_estimator", "rloo_vectorized", "advantage", "rloo"),
    PeerRow("adv_estimator", "reinforce_plus_plus", "token_advantage", "reinforce_pp_returns", dict(gamma=1.0, eps=1e-8),
            note="Equal on any mask: verl carries the return through masked tokens (since 8a1bf6d), as jaxgrpo does."),
    PeerRow("adv_estimator", "reinforce_plus_plus_baseline", "advantage", "dr_grpo",
            note="verl then whitens over the batch's tokens: masked_whiten(A[:, None] * mask, mask), each row counted "
                 "once per token; reinforce_pp_baseline with whiten='tokens' (its default) and lengths does both steps.",
            differences=(_one_rollout("verl", "r before whitening"),)),
    PeerRow("adv_estimator", "remax", "advantage", "remax"),
    PeerRow("adv_estimator", "opo", "advantage", "opo"),
    PeerRow("adv_estimator", "grpo_passk", "advantage", "pass_at_k"),
    PeerRow("adv_estimator", "gpg", "advantage", "gpg"),
    PeerRow("adv_estimator", "gdpo", "advantage", "gdpo", dict(std_ddof=1, eps=1e-6, whiten="tokens"),
            note="rewards [N, K] from algorithm.gdpo_reward_keys, reward_weights = gdpo_reward_weights (default all "
                 "ones), lengths = the completion lengths: GRPO per reward, the weighted sum, then masked_whiten over "
                 "the batch's tokens.",
            differences=(_one_rollout("verl", "r / (1 + eps) per reward before whitening"),)),
    PeerRow("adv_estimator", "optimal_token_baseline", "token_advantage", "optimal_token_baseline",
            dict(handle_zero_tail=True),
            note="Needs sum_pi_squared (the sum over the vocabulary of pi^2 per token) as an input. "
                 "handle_zero_tail=True is verl's default since 8acd940 (False before), and jaxgrpo's."),
    PeerRow("adv_estimator", "tir_optimal_token_baseline", None, None,
            note="Missing: the multi-turn (tool-interleaved) form, which needs per-turn segments of a trajectory."),
    # policy_loss.loss_mode (POLICY_LOSS_REGISTRY); the clip ranges are the actor's clip_ratio_low / clip_ratio_high
    PeerRow("policy_loss", "vanilla", "loss", "ppo_clip", dict(_VERL_CLIP, clip_ratio_c=_VERL_CLIP_C),
            note="clip_ratio_low / clip_ratio_high / clip_ratio_c as eps_low / eps_high / clip_ratio_c."),
    PeerRow("policy_loss", "gspo", "loss", "gspo_token", dict(_VERL_CLIP), "seq_mean_token_mean",
            note="verl's gspo is the GSPO-token form and always aggregates seq-mean-token-mean; it bounds the "
                 "sequence log-ratio at 10, as jaxgrpo. verl's GSPO recipe (and the paper) set clip_ratio_low=3e-4, "
                 "clip_ratio_high=4e-4, jaxgrpo's defaults.",
            differences=("jaxgrpo clamps each token's log-ratio to +-20 before the sequence mean; verl does not.",)),
    PeerRow("policy_loss", "sapo", "loss", "sapo", dict(tau_pos=1.0, tau_neg=1.05), "seq_mean_token_mean",
            note="The actor's tau_pos / tau_neg; verl always aggregates sapo seq-mean-token-mean."),
    PeerRow("policy_loss", "gpg", "loss", "reinforce", note="-A log pi, no ratio."),
    PeerRow("policy_loss", "cispo", "loss", "cispo", dict(_VERL_CLIP),
            note="verl clips the weight on both sides: clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high)."),
    PeerRow("policy_loss", "geo_mean", "loss", "gmpo", dict(_VERL_CLIP), "seq_mean_token_mean",
            note="verl reads the PPO clip ratio (0.2); jaxgrpo's default is the paper's 0.4.",
            differences=(_unclamped("verl"), _EVERY_ROW.format(peer="verl"))),
    PeerRow("policy_loss", "clip_cov", "loss", "clip_cov",
            dict(_VERL_CLIP, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0),
            note="policy_loss.clip_cov_ratio / clip_cov_lb / clip_cov_ub. Pass key= for verl's random choice among "
                 "the candidates.",
            differences=(_unclamped("verl"),
                         "Without a key jaxgrpo detaches the candidates of largest covariance, verl random ones: "
                         "equal when the candidates are at most k.")),
    PeerRow("policy_loss", "kl_cov", "loss", "kl_cov", dict(kl_cov_ratio=2e-4, ppo_kl_coef=0.1),
            note="policy_loss.kl_cov_ratio / ppo_kl_coef: 0.1 is verl's config default (its code falls back to 1 "
                 "without a config); jaxgrpo's default is the paper's 1.",
            differences=(_unclamped("verl"),)),
    PeerRow("policy_loss", "bypass_mode (loss_type=ppo_clip)", "loss", "ppo_clip",
            dict(_VERL_CLIP, clip_ratio_c=_VERL_CLIP_C), note="old_logp = the rollout's log-probs."),
    PeerRow("policy_loss", "bypass_mode (loss_type=reinforce)", "loss", "reinforce",
            note="Multiply by importance_correction(logp, rollout_logp, mask) weights when rollout_is is set."),
    PeerRow("policy_loss", "dppo_tv", "loss", "dppo_tv", dict(delta_low=0.2, delta_high=0.2, max_ratio=_VERL_CLIP_C),
            note="delta_low / delta_high = clip_ratio_low / clip_ratio_high; max_ratio = clip_ratio_c, 3.0 in verl's "
                 "default config (its code falls back to 20, jaxgrpo's default, only without the key)."),
    PeerRow("policy_loss", "dppo_kl", "loss", "dppo_kl", dict(delta_low=0.2, delta_high=0.2, max_ratio=_VERL_CLIP_C),
            note="As dppo_tv."),
    PeerRow("policy_loss", "dro", "loss", "dro",
            note="beta = policy_loss.dro_beta, which verl requires (no default); jaxgrpo's default beta=0.1 is "
                 "Tinker's."),
    # kl_penalty / kl_loss_type
    PeerRow("kl_penalty", "kl / k1", "kl", "k1"),
    PeerRow("kl_penalty", "abs", "kl", "abs"),
    PeerRow("kl_penalty", "mse / k2", "kl", "k2"),
    PeerRow("kl_penalty", "low_var_kl / k3", "kl", "k3", dict(clamp=10.0),
            note="verl clamps k3 to [-10, 10] (jaxgrpo's default: no clamp)."),
    PeerRow("kl_penalty", "k1+", "kl", "k1+",
            note="The value of k1, the gradient of k2. verl strips the '+' since 7e80ab0 (it raised "
                 "NotImplementedError before)."),
    PeerRow("kl_penalty", "k3+ / low_var_kl+", "kl", "k3+", dict(clamp=10.0),
            note="The value of k3 clamped to [-10, 10] as low_var_kl, the gradient of k2."),
    PeerRow("kl_penalty", "abs+", "kl", "abs+", note="The value of abs, the gradient of k2."),
    PeerRow("kl_penalty", "full", None, None,
            note="Missing: needs the full vocabulary distributions; verl raises NotImplementedError too."),
    # loss_agg_mode (agg_loss)
    PeerRow("loss_agg_mode", "token-mean", "aggregation", "token_mean"),
    PeerRow("loss_agg_mode", "seq-mean-token-sum", "aggregation", "seq_mean_token_sum"),
    PeerRow("loss_agg_mode", "seq-mean-token-mean", "aggregation", "seq_mean_token_mean"),
    PeerRow("loss_agg_mode", "seq-mean-token-sum-norm", "aggregation", "seq_mean_token_sum_norm", dict(max_len="T"),
            note="The sequences' token sums averaged over the sequences with a token, / loss_scale_factor (default "
                 "T). Since 3671d37; before, verl did not divide by the number of sequences."),
    PeerRow("loss_agg_mode", "token-sum", "aggregation", "token_sum"),
)

_TRL_KEEPS_RATIO = ("TRL keeps the ratio where it is not masked: multiply these 0/1 weights by the ratio "
                    "itself (the same call with mode='truncate', threshold=inf).")
_TRL_CLIP = dict(eps_low=0.2, eps_high=0.2)  # GRPOConfig: epsilon=0.2, epsilon_high defaults to epsilon
_TRL_UNCLAMPED = _unclamped("TRL")
_TRL_SEQUENCE_BOUND = ("jaxgrpo's gspo bounds the sequence log-ratio at 10 (max_seq_log_ratio, as verl), TRL does not: "
                       "pass max_seq_log_ratio=inf to lift it.")
_TRL = (
    # loss_type: the policy loss and its normalization
    PeerRow("loss_type", "grpo", "loss", "ppo_clip", dict(_TRL_CLIP), "seq_mean_token_mean",
            differences=(_TRL_UNCLAMPED,)),
    PeerRow("loss_type", "bnpo", "loss", "ppo_clip", dict(_TRL_CLIP), "token_mean",
            note="Normalized by the tokens of the local micro-batch: aggregate without a full-batch denominator.",
            differences=(_TRL_UNCLAMPED,)),
    PeerRow("loss_type", "dr_grpo", "loss", "ppo_clip", dict(_TRL_CLIP), "seq_mean_token_sum_norm", dict(max_len="T"),
            note="max_len = max_completion_length.",
            differences=(_TRL_UNCLAMPED, _EVERY_ROW.format(peer="TRL"))),
    PeerRow("loss_type", "dapo", "loss", "ppo_clip", dict(_TRL_CLIP), "token_mean",
            note="TRL's default loss_type. Normalized by the tokens of the whole accumulated batch: pass its "
                 "aggregation_denominator.",
            differences=(_TRL_UNCLAMPED,)),
    PeerRow("loss_type", "cispo", "loss", "cispo", dict(eps_low=None, eps_high=4.0), "token_mean",
            note="TRL's epsilon_high caps the ratio itself (5.0 recommended): eps_high = epsilon_high - 1; no lower "
                 "clip. TRL's default epsilon_high (None: epsilon = 0.2) would cap the ratio at 0.2.",
            differences=(_TRL_UNCLAMPED,)),
    PeerRow("loss_type", "sapo", "loss", "sapo", dict(tau_pos=1.0, tau_neg=1.05), "seq_mean_token_mean",
            note="sapo_temperature_pos / sapo_temperature_neg.", differences=(_TRL_UNCLAMPED,)),
    PeerRow("loss_type", "luspo", "loss", "gspo", dict(_TRL_CLIP), "seq_mean_token_sum",
            note="With importance_sampling_level='sequence' (required): GSPO's sequence loss times its length, "
                 "averaged over sequences. The paper uses epsilon=2e-3, epsilon_high=2.5e-3.",
            differences=(_TRL_UNCLAMPED, _TRL_SEQUENCE_BOUND, _EVERY_ROW.format(peer="TRL"))),
    PeerRow("loss_type", "vespo", "loss", "vespo", dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0), "token_mean",
            note="vespo_k_pos / vespo_lambda_pos / vespo_k_neg / vespo_lambda_neg; with vLLM importance sampling, "
                 "pass its token weights as importance_weights."),
    # importance_sampling_level
    PeerRow("importance_sampling_level", "token", "loss", "ppo_clip", dict(_TRL_CLIP),
            note="The default: one ratio per token.", differences=(_TRL_UNCLAMPED,)),
    PeerRow("importance_sampling_level", "sequence", "loss", "gspo", dict(_TRL_CLIP), "seq_mean_token_mean",
            note="With loss_type='grpo': GSPO. Its paper uses epsilon=3e-4, epsilon_high=4e-4.",
            differences=(_TRL_UNCLAMPED, _TRL_SEQUENCE_BOUND)),
    PeerRow("delta", "delta (two-sided clipping)", "loss", "ppo_clip", dict(_TRL_CLIP, clip_ratio_c=3.0),
            note="INTELLECT-2's upper bound on the ratio of negative-advantage tokens is dual clipping with "
                 "clip_ratio_c = delta: equal when delta > 1 + epsilon_high (as TRL recommends). Example: delta=3 "
                 "(TRL's default None turns it off).",
            differences=(_TRL_UNCLAMPED,)),
    # scale_rewards and multi-reward aggregation: the advantage
    PeerRow("scale_rewards", "group", "advantage", "grpo", dict(std_ddof=1, eps=1e-4)),
    PeerRow("scale_rewards", "batch", "advantage", "grpo_batch_std", dict(std_ddof=1, eps=1e-4)),
    PeerRow("scale_rewards", "none", "advantage", "dr_grpo"),
    PeerRow("multi_objective_aggregation", "sum_then_normalize", "advantage", "grpo", dict(std_ddof=1, eps=1e-4),
            note="Of the weighted sum of the rewards."),
    PeerRow("multi_objective_aggregation", "normalize_then_sum", "advantage", "gdpo", dict(std_ddof=1, eps=1e-4),
            note="rewards [N, K], reward_weights as TRL's."),
    # KL
    PeerRow("beta", "beta > 0 (KL term)", "kl", "k3_unbiased",
            note="use_bias_correction_kl=True is TRL's default since 1.16 (False before): k3 times the ratio "
                 "pi / pi_old; old_logp = the old policy's log-probs.",
            differences=(_unclamped("TRL", _REFERENCE_RATIO), _TRL_UNCLAMPED)),
    PeerRow("use_bias_correction_kl", "False", "kl", "k3", differences=(_unclamped("TRL", _REFERENCE_RATIO),)),
    # masks
    PeerRow("off_policy_mask_threshold", "delta", "mask", "off_policy_sequence_mask", dict(threshold=0.5),
            note="threshold = off_policy_mask_threshold (example 0.5; TRL's default None turns the mask off); "
                 "sampler_logp = vLLM's log-probs, else old_logp."),
    PeerRow("top_entropy_quantile", "rho", "mask", "high_entropy_token_mask", dict(top_quantile=0.2),
            note="top_quantile = top_entropy_quantile (0.2 recommended; TRL's default 1.0 keeps every token)."),
    # vLLM importance sampling correction: weights from the old policy and vLLM's log-probs
    PeerRow("vllm_importance_sampling_mode", "token_truncate", "credit", "importance_correction",
            dict(level="token", mode="truncate", threshold=3.0),
            note="threshold = vllm_importance_sampling_clip_max; TRL's clip_min (default None) also floors the weight."),
    PeerRow("vllm_importance_sampling_mode", "token_mask", "credit", "importance_correction",
            dict(level="token", mode="mask", threshold=3.0, lower_threshold=0.0),
            note="lower_threshold = vllm_importance_sampling_clip_min, 0 when None. " + _TRL_KEEPS_RATIO),
    PeerRow("vllm_importance_sampling_mode", "sequence_truncate", "credit", "importance_correction",
            dict(level="sequence", mode="truncate", threshold=3.0)),
    PeerRow("vllm_importance_sampling_mode", "sequence_mask", "credit", "importance_correction",
            dict(level="sequence", mode="mask", threshold=3.0, lower_threshold=0.0),
            note="TRL's default mode. " + _TRL_KEEPS_RATIO),
)

_TUNIX = (
    # advantage_estimator
    PeerRow("advantage_estimator", "grpo", "advantage", "grpo", dict(std_ddof=1, eps=1e-6)),
    PeerRow("advantage_estimator", "rloo", "advantage", "rloo"),
    PeerRow("advantage_estimator", "drgrpo", "advantage", "dr_grpo"),
    PeerRow("advantage_estimator", "gae", "token_advantage", "gae", dict(gamma=1.0, lam=0.95),
            note="PPOConfig's gamma and gae_lambda (1.0 and 0.95; verl's lam is 1.0). tunix then whitens the "
                 "advantages: masked_whiten(advantages, mask)."),
    # policy_loss_fn
    PeerRow("policy_loss_fn", "grpo (loss_algo='grpo')", "loss", "ppo_clip", dict(eps_low=0.2, eps_high=0.2),
            "seq_mean_token_mean", note="epsilon / epsilon_high; epsilon_c as clip_ratio_c (dual clip)."),
    PeerRow("policy_loss_fn", "grpo (loss_algo='gspo-token')", "loss", "gspo_token", dict(eps_low=0.2, eps_high=0.2),
            "seq_mean_token_mean", note="tunix bounds the sequence log-ratio at 10, as jaxgrpo."),
    PeerRow("policy_loss_fn", "ppo", "loss", "ppo_clip", dict(eps_low=0.2, eps_high=0.2), "token_mean",
            note="PPOConfig's epsilon (epsilon_low / epsilon_high default to it).", differences=(_unclamped("tunix"),)),
    PeerRow("value_loss_fn", "ppo", "function", "clipped_value_loss", dict(clip_range=0.2), "token_mean",
            note="clip_range = clip_range_value."),
    # kl_loss_mode
    PeerRow("kl_loss_mode", "kl", "kl", "k1", note="kl_clamp_value as clamp."),
    PeerRow("kl_loss_mode", "mse_kl", "kl", "k2"),
    PeerRow("kl_loss_mode", "low_var_kl", "kl", "k3", differences=(_unclamped("tunix", _REFERENCE_RATIO),)),
    # loss_agg_mode
    PeerRow("loss_agg_mode", "token-mean", "aggregation", "token_mean"),
    PeerRow("loss_agg_mode", "sequence-mean-token-mean", "aggregation", "seq_mean_token_mean"),
    PeerRow("loss_agg_mode", "sequence-mean-token-scale", "aggregation", "seq_mean_token_sum_norm", dict(max_len="T"),
            note="max_len = the norm keyword (default T). Dr. GRPO's default in tunix."),
    PeerRow("loss_agg_mode", "seq-mean-token-sum", "aggregation", "seq_mean_token_sum"),
    PeerRow("loss_agg_mode", "sequence-mean-token-sum-norm", "aggregation", "seq_mean_token_sum", dict(denominator="N"),
            note="sum of the token losses / norm (default the batch size N)."),
    # DAPO's reward shaping
    PeerRow("overlong_buffer", "DAPO reward_shaping", "reward", "overlong_penalty", dict(max_len=20480, cache_len=4096),
            note="max_response_length, overlong_buffer_length; penalty 1.",
            differences=("Beyond max_len tunix keeps decreasing, jaxgrpo stays at -1.",)),
)

COVERAGE: dict[str, tuple[PeerRow, ...]] = {"verl": _VERL, "trl": _TRL, "tunix": _TUNIX}


def check_peer(peer: str) -> str:
    """`peer` if it is a known peer; otherwise a ValueError listing the valid ones."""
    if peer not in COVERAGE:
        raise ValueError(f"unknown peer {peer!r}; valid peers: {', '.join(sorted(COVERAGE))}")
    return peer


def coverage(peer: str) -> tuple[PeerRow, ...]:
    """The coverage rows of one peer, in the order of its source."""
    return COVERAGE[check_peer(peer)]


def is_available(row: PeerRow) -> bool:
    """Whether the kernel (or mode, or function) a row names exists in this build."""
    if row.ours is None:
        return False
    if row.kind == "aggregation":
        return row.ours in AGGREGATION_MODES
    if row.kind == "function":
        from jaxgrpo import kernels

        return callable(getattr(kernels, row.ours, None))
    return any(info.name == row.ours for info in registry.list_kernels(row.kind))


def resolve_options(options: Mapping[str, Any], mask_shape: tuple[int, int]) -> dict[str, Any]:
    """`options` with the size symbols `"T"` and `"N"` replaced by the sizes of a [N, T] mask."""
    sizes = {"N": mask_shape[0], "T": mask_shape[1]}
    return {k: sizes[v] if isinstance(v, str) and v in sizes else v for k, v in options.items()}


def format_options(row: PeerRow) -> str:
    """`eps_low=0.2, eps_high=0.2; aggregate mode=token_mean`: the options, then the aggregation."""
    parts = [", ".join(f"{k}={v!r}" if isinstance(v, str) and v not in SIZE_SYMBOLS else f"{k}={v}"
                       for k, v in row.options.items())]
    if row.aggregation:
        extra = "".join(f", {k}={v}" for k, v in row.aggregation_options.items())
        parts.append(f"aggregate mode={row.aggregation}{extra}")
    return "; ".join(p for p in parts if p)


def table(peer: str, *, mark_unavailable: bool = False) -> list[tuple[str, str, str, str, str, str]]:
    """Rows of (peer setting, peer value, our kernel, options, note, deliberate differences) for printing.

    With `mark_unavailable`, a kernel this build lacks is marked `(not in this build)`.
    """
    out = []
    for row in coverage(peer):
        if row.ours is None:
            ours = "missing"
        else:
            ours = f"{row.kind} {row.ours}"
            if mark_unavailable and not is_available(row):
                ours += " (not in this build)"
        out.append((row.peer_kind, row.peer_name, ours, format_options(row), row.note, " ".join(row.differences)))
    return out
