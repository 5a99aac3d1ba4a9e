"""Peer coverage: each kernel of verl, TRL and tunix, and the jaxgrpo kernel and options that reproduce it.

Every row names one entry of a peer's own registry or configuration (verl's
`adv_estimator`, TRL's `GRPOConfig.loss_type`, tunix's `policy_loss_fn`, ...),
the jaxgrpo kernel that computes the same function, the keyword options that
make it equal, and, for a policy loss whose normalization the peer fixes, the
aggregation mode. A row without a kernel says so (`ours is None`) and why.

    jaxgrpo-kernels --peer verl        # the table, with what this build lacks
    jaxgrpo.kernels.peers.coverage("trl")

Option values are numbers, with two symbols for sizes that depend on the batch:
`"T"` is the padded completion length (`mask.shape[1]`, verl's default
`loss_scale_factor`, TRL's `max_completion_length` when completions are padded
to it) and `"N"` the number of rows (`mask.shape[0]`); `resolve_options`
replaces them. Each peer is pinned to the commit its source was read at; the
rows state the differences that remain (e.g. a group of one rollout).
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
    """A peer library and the source it was read from."""

    name: str
    repository: str
    commit: str
    files: tuple[str, ...]


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
    """

    peer_kind: str
    peer_name: str
    kind: str | None
    ours: str | None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    aggregation: str | None = None
    aggregation_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""

    def __post_init__(self):
        if (self.kind is None) != (self.ours is None):
            raise ValueError(f"{self.peer_name}: kind and ours are both set or both None")
        if self.kind is not None and self.kind not in ROW_KINDS:
            raise ValueError(f"{self.peer_name}: unknown kind {self.kind!r}; valid kinds: {', '.join(ROW_KINDS)}")
        if self.aggregation is not None and self.aggregation not in AGGREGATION_MODES:
            raise ValueError(f"{self.peer_name}: unknown aggregation mode {self.aggregation!r}")


PEERS: dict[str, Peer] = {
    "verl": Peer(
        "verl", "volcengine/verl", "b178a3cd56f58b2d502255daba591e92833930a7",
        ("verl/trainer/ppo/core_algos.py",),
    ),
    "trl": Peer(
        "trl", "huggingface/trl", "f2cd57710ae345ea6428ae95363267fcf38a3dc8",
        ("trl/trainer/grpo_config.py", "trl/trainer/grpo_trainer.py"),
    ),
    "tunix": Peer(
        "tunix", "google/tunix", "c7d8950f12a9c55a976bf2e1a0d8b447d71c20b3",
        ("tunix/rl/algo_core.py", "tunix/rl/common.py", "tunix/rl/grpo/grpo_learner.py",
         "tunix/rl/grpo/dapo_learner.py", "tunix/rl/grpo/drgrpo_learner.py", "tunix/rl/ppo/ppo_learner.py"),
    ),
}

_ONE_ROLLOUT = "A group of one rollout: {peer} gives {value}, jaxgrpo 0."
_VERL_CLIP = dict(eps_low=0.2, eps_high=0.2)  # verl's actor clip_ratio default, low and high
_VERL_NOT_AT_COMMIT = ("Not in core_algos.py at the commit read; the formula follows later versions of "
                       "verl's core_algos.py.")

_VERL = (
    # adv_estimator (ADV_ESTIMATOR_REGISTRY)
    PeerRow("adv_estimator", "gae", "token_advantage", "gae", dict(gamma=1.0, lam=1.0),
            note="verl then whitens the advantages over the batch's tokens: masked_whiten(advantages, mask); "
                 "the returns are not whitened."),
    PeerRow("adv_estimator", "grpo", "advantage", "grpo", dict(std_ddof=1, eps=1e-6),
            note="norm_adv_by_std_in_grpo=True (default). " + _ONE_ROLLOUT.format(peer="verl", value="r / (1 + eps)")),
    PeerRow("adv_estimator", "grpo (norm_adv_by_std_in_grpo=False)", "advantage", "dr_grpo",
            note=_ONE_ROLLOUT.format(peer="verl", value="r")),
    PeerRow("adv_estimator", "grpo_vectorized", "advantage", "grpo", dict(std_ddof=1, eps=1e-6),
            note="Equal unless a group's variance is below eps (verl floors the variance at eps = 1e-6). "
                 + _ONE_ROLLOUT.format(peer="verl", value="r / (1 + eps)")),
    PeerRow("adv_estimator", "rloo", "advantage", "rloo", note=_ONE_ROLLOUT.format(peer="verl", value="r")),
    PeerRow("adv_estimator", "rloo_vectorized", "advantage", "rloo"),
    PeerRow("adv_estimator", "reinforce_plus_plus", "token_advantage", "reinforce_pp_returns", dict(gamma=1.0, eps=1e-8),
            note="Token rewards on right-padded masks (verl restarts the return at a masked token; jaxgrpo skips it)."),
    PeerRow("adv_estimator", "reinforce_plus_plus_baseline", "advantage", "dr_grpo",
            note="verl then whitens over the batch's tokens: masked_whiten(A[:, None] * mask, mask), each row counted "
                 "once per token; reinforce_pp_baseline with whiten='tokens' (its default) and lengths does both steps. "
                 + _ONE_ROLLOUT.format(peer="verl", value="r before whitening")),
    PeerRow("adv_estimator", "remax", "advantage", "remax"),
    PeerRow("adv_estimator", "opo", "advantage", "opo"),
    PeerRow("adv_estimator", "grpo_passk", "advantage", "pass_at_k"),
    PeerRow("adv_estimator", "gpg", "advantage", "gpg"),
    PeerRow("adv_estimator", "optimal_token_baseline", "token_advantage", "optimal_token_baseline",
            note="Needs sum_pi_squared (the sum over the vocabulary of pi^2 per token) as an input."),
    PeerRow("adv_estimator", "tir_optimal_token_baseline", None, None,
            note="Missing: the multi-turn (tool-interleaved) form, which needs per-turn segments of a trajectory."),
    # policy_loss.loss_mode (POLICY_LOSS_REGISTRY)
    PeerRow("policy_loss", "vanilla", "loss", "ppo_clip", dict(_VERL_CLIP, clip_ratio_c=3.0),
            note="clip_ratio_low / clip_ratio_high / clip_ratio_c as eps_low / eps_high / clip_ratio_c."),
    PeerRow("policy_loss", "gspo", "loss", "gspo_token", dict(eps_low=3e-4, eps_high=4e-4), "seq_mean_token_mean",
            note="verl's gspo is the GSPO-token form and always aggregates seq-mean-token-mean; it clamps the "
                 "sequence log-ratio at 10. Options: the GSPO paper's clip range, which verl's recipe sets."),
    PeerRow("policy_loss", "sapo", "loss", "sapo", dict(tau_pos=1.0, tau_neg=1.05), "seq_mean_token_mean",
            note="verl always aggregates sapo seq-mean-token-mean."),
    PeerRow("policy_loss", "gpg", "loss", "reinforce", note="-A log pi, no ratio."),
    PeerRow("policy_loss", "cispo", "loss", "cispo", dict(_VERL_CLIP),
            note="verl clips the weight on both sides: clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high)."),
    PeerRow("policy_loss", "geo_mean", "loss", "gmpo"),
    PeerRow("policy_loss", "clip_cov", "loss", "clip_cov"),
    PeerRow("policy_loss", "kl_cov", "loss", "kl_cov"),
    PeerRow("policy_loss", "bypass_mode (loss_type=ppo_clip)", "loss", "ppo_clip", dict(_VERL_CLIP, clip_ratio_c=3.0),
            note="old_logp = the rollout's log-probs."),
    PeerRow("policy_loss", "bypass_mode (loss_type=reinforce)", "loss", "reinforce",
            note="Multiply by importance_correction(logp, rollout_logp, mask) weights when rollout_is is set."),
    PeerRow("policy_loss", "dppo_tv", "loss", "dppo_tv", note=_VERL_NOT_AT_COMMIT),
    PeerRow("policy_loss", "dppo_kl", "loss", "dppo_kl", note=_VERL_NOT_AT_COMMIT),
    PeerRow("policy_loss", "dro", "loss", "dro",
            note="Not in core_algos.py at the commit read, nor in any verl source reached: the formula follows "
                 "Tinker's DRO loss (beta = 0.1), unchecked against verl."),
    # kl_penalty / kl_loss_type
    PeerRow("kl_penalty", "kl / k1", "kl", "k1"),
    PeerRow("kl_penalty", "abs", "kl", "abs"),
    PeerRow("kl_penalty", "mse / k2", "kl", "k2"),
    PeerRow("kl_penalty", "low_var_kl / k3", "kl", "k3", dict(clamp=10.0), note="verl clamps k3 to [-10, 10]."),
    PeerRow("kl_penalty", "k1+", "kl", "k1+",
            note="The value of k1, the gradient of k2. At the commit read verl raises NotImplementedError for every "
                 "'+' name (its forward pass does not strip the '+'); jaxgrpo follows the documented intent."),
    PeerRow("kl_penalty", "k3+ / low_var_kl+", "kl", "k3+", note="As k1+: the value of k3, the gradient of k2."),
    PeerRow("kl_penalty", "abs+", "kl", "abs+", note="As k1+: the value of abs, the gradient of k2."),
    PeerRow("kl_penalty", "full", None, None,
            note="Missing: needs the full vocabulary distributions; verl raises NotImplementedError too."),
    # loss_agg_mode (agg_loss)
    PeerRow("loss_agg_mode", "token-mean", "aggregation", "token_mean"),
    PeerRow("loss_agg_mode", "seq-mean-token-sum", "aggregation", "seq_mean_token_sum"),
    PeerRow("loss_agg_mode", "seq-mean-token-mean", "aggregation", "seq_mean_token_mean"),
    PeerRow("loss_agg_mode", "seq-mean-token-sum-norm", "aggregation", "seq_mean_token_sum", dict(denominator="T"),
            note="sum of the token losses / loss_scale_factor (default T), not divided by the number of sequences."),
    PeerRow("loss_agg_mode", "token-sum", "aggregation", "token_sum"),
)

_TRL_KEEPS_RATIO = ("TRL keeps the ratio where it is not masked: multiply these 0/1 weights by the ratio "
                    "itself (the same call with mode='truncate', threshold=inf).")
_TRL_CLIP = dict(eps_low=0.2, eps_high=0.2)  # GRPOConfig: epsilon=0.2, epsilon_high defaults to epsilon
_TRL = (
    # loss_type: the policy loss and its normalization
    PeerRow("loss_type", "grpo", "loss", "ppo_clip", dict(_TRL_CLIP), "seq_mean_token_mean"),
    PeerRow("loss_type", "bnpo", "loss", "ppo_clip", dict(_TRL_CLIP), "token_mean",
            note="Normalized by the tokens of the local micro-batch: aggregate without a full-batch denominator."),
    PeerRow("loss_type", "dr_grpo", "loss", "ppo_clip", dict(_TRL_CLIP), "seq_mean_token_sum_norm", dict(max_len="T"),
            note="max_len = max_completion_length. TRL divides by every row, jaxgrpo by the rows with a token: "
                 "equal unless a row is fully masked."),
    PeerRow("loss_type", "dapo", "loss", "ppo_clip", dict(_TRL_CLIP), "token_mean",
            note="Normalized by the tokens of the whole accumulated batch: pass its aggregation_denominator."),
    PeerRow("loss_type", "cispo", "loss", "cispo", dict(eps_low=None, eps_high=4.0), "token_mean",
            note="TRL's epsilon_high caps the ratio itself (5.0 recommended): eps_high = epsilon_high - 1; no lower clip."),
    PeerRow("loss_type", "sapo", "loss", "sapo", dict(tau_pos=1.0, tau_neg=1.05), "seq_mean_token_mean",
            note="sapo_temperature_pos / sapo_temperature_neg."),
    PeerRow("loss_type", "luspo", "loss", "gspo", dict(_TRL_CLIP), "seq_mean_token_sum",
            note="With importance_sampling_level='sequence' (required): GSPO's sequence loss times its length, "
                 "averaged over sequences. The paper uses epsilon=2e-3, epsilon_high=2.5e-3. TRL averages over every "
                 "row, jaxgrpo over the rows with a token."),
    PeerRow("loss_type", "vespo", "loss", "vespo", dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0), "token_mean",
            note="vespo_k_pos / vespo_lambda_pos / vespo_k_neg / vespo_lambda_neg; with vLLM importance sampling, "
                 "pass its token weights as importance_weights."),
    # importance_sampling_level
    PeerRow("importance_sampling_level", "token", "loss", "ppo_clip", dict(_TRL_CLIP),
            note="The default: one ratio per token."),
    PeerRow("importance_sampling_level", "sequence", "loss", "gspo", dict(_TRL_CLIP), "seq_mean_token_mean",
            note="With loss_type='grpo': GSPO. Its paper uses epsilon=3e-4, epsilon_high=4e-4."),
    PeerRow("delta", "delta (two-sided clipping)", "loss", "ppo_clip", dict(_TRL_CLIP, clip_ratio_c=3.0),
            note="INTELLECT-2's upper bound on the ratio of negative-advantage tokens is dual clipping with "
                 "clip_ratio_c = delta: equal when delta > 1 + epsilon_high (as TRL recommends). Example: delta=3."),
    # scale_rewards and multi-reward aggregation: the advantage
    PeerRow("scale_rewards", "group", "advantage", "grpo", dict(std_ddof=1, eps=1e-4)),
    PeerRow("scale_rewards", "batch", "advantage", "grpo_batch_std", dict(std_ddof=1, eps=1e-4)),
    PeerRow("scale_rewards", "none", "advantage", "dr_grpo"),
    PeerRow("multi_objective_aggregation", "sum_then_normalize", "advantage", "grpo", dict(std_ddof=1, eps=1e-4),
            note="Of the weighted sum of the rewards."),
    PeerRow("multi_objective_aggregation", "normalize_then_sum", "advantage", "gdpo", dict(std_ddof=1, eps=1e-4),
            note="rewards [N, K], reward_weights as TRL's."),
    # KL
    PeerRow("beta", "beta > 0 (KL term)", "kl", "k3"),
    PeerRow("use_bias_correction_kl", "True", "kl", "k3_unbiased", note="old_logp = the old policy's log-probs."),
    # masks
    PeerRow("off_policy_mask_threshold", "delta", "mask", "off_policy_sequence_mask", dict(threshold=0.5),
            note="threshold = off_policy_mask_threshold (example 0.5); sampler_logp = vLLM's log-probs, else old_logp."),
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
    PeerRow("advantage_estimator", "gae", "token_advantage", "gae", dict(gamma=1.0, lam=1.0),
            note="gamma, gae_lambda from the config; tunix then whitens the advantages: masked_whiten(advantages, mask)."),
    # policy_loss_fn
    PeerRow("policy_loss_fn", "grpo (loss_algo='grpo')", "loss", "ppo_clip", dict(eps_low=0.2, eps_high=0.2),
            "seq_mean_token_mean", note="epsilon / epsilon_high; epsilon_c as clip_ratio_c (dual clip)."),
    PeerRow("policy_loss_fn", "grpo (loss_algo='gspo-token')", "loss", "gspo_token", dict(eps_low=0.2, eps_high=0.2),
            "seq_mean_token_mean", note="tunix clamps the sequence log-ratio at 10."),
    PeerRow("policy_loss_fn", "ppo", "loss", "ppo_clip", dict(eps_low=0.2, eps_high=0.2), "token_mean",
            note="tunix does not clamp the log-ratio (jaxgrpo at +-20)."),
    PeerRow("value_loss_fn", "ppo", "function", "clipped_value_loss", dict(clip_range=0.2), "token_mean",
            note="clip_range = clip_range_value."),
    # kl_loss_mode
    PeerRow("kl_loss_mode", "kl", "kl", "k1", note="kl_clamp_value as clamp."),
    PeerRow("kl_loss_mode", "mse_kl", "kl", "k2"),
    PeerRow("kl_loss_mode", "low_var_kl", "kl", "k3", note="tunix does not clamp the log-ratio (jaxgrpo at +-20)."),
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
            note="max_response_length, overlong_buffer_length; penalty 1. Beyond max_len tunix keeps decreasing, "
                 "jaxgrpo stays at -1."),
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


def table(peer: str, *, mark_unavailable: bool = False) -> list[tuple[str, str, str, str, str]]:
    """Rows of (peer setting, our kernel, options, note) for printing.

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
        out.append((row.peer_kind, row.peer_name, ours, format_options(row), row.note))
    return out
