"""The peer tables against the peers' defaults as read upstream, at the commit (or release) each is pinned to.

`UPSTREAM` records, as data, the defaults read in each peer's source at its pin (the files are named beside
each value). Every option of a coverage row is either one of these defaults (`Default`), and must equal it,
or says why it is not one: it selects the peer's formula (`Form`), or it is a value the peer recommends or
gives as an example, which the row's note then states (`Stated`). A table that claims a default the pinned
source does not have fails here; so does re-pinning a peer without reading its defaults again (the pins must
match). Our kernels' own defaults that their docstrings relate to a peer's are checked too: equal where the
docstring says "as <peer>", or the docstring names the peer's value. Every log-ratio clamp ours applies where
the peer's formula does not is a deliberate difference the row must name.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import os
import re
from typing import Any

import pytest

import jaxgrpo
from jaxgrpo.catalog import peers
from tests.support.paths import REPO_ROOT


@dataclasses.dataclass(frozen=True)
class Read:
    """What was read at one peer's pin: the defaults, and which formulas clamp a log-ratio at +-20."""

    commit: str | None
    release: str | None
    date: str
    defaults: dict[str, Any]
    clamps_log_ratio: dict[str, bool]


UPSTREAM = {
    # verl-project/verl (formerly volcengine/verl) at 1dda039, 2026-08-22.
    "verl": Read(
        commit="1dda039b9c6311889a9c9a26040677e1254814f9", release=None, date="2026-08-22",
        defaults={
            # verl/trainer/config/ppo_trainer.yaml, algorithm:
            "algorithm.gamma": 1.0,
            "algorithm.lam": 1.0,
            # verl/trainer/config/actor/actor.yaml (= verl/workers/config/actor.py):
            "actor.clip_ratio_low": 0.2,
            "actor.clip_ratio_high": 0.2,
            "actor.clip_ratio_c": 3.0,
            "actor.tau_pos": 1.0,
            "actor.tau_neg": 1.05,
            "actor.loss_scale_factor": "T",  # null: the response length, loss_mask.shape[-1]
            "policy_loss.clip_cov_ratio": 2e-4,
            "policy_loss.clip_cov_lb": 1.0,
            "policy_loss.clip_cov_ub": 5.0,
            "policy_loss.kl_cov_ratio": 2e-4,
            "policy_loss.ppo_kl_coef": 0.1,
            "policy_loss.dro_beta": None,  # required: dro raises without a positive value
            # verl/trainer/config/critic/critic.yaml:
            "critic.cliprange_value": 0.5,
            # verl/trainer/ppo/core_algos.py, function defaults and constants:
            "compute_grpo_outcome_advantage.epsilon": 1e-6,
            "compute_grpo_outcome_advantage.std_ddof": 1,  # torch.std
            "compute_grpo_vectorized_outcome_advantage.epsilon": 1e-6,
            "group_mean_std.ddof": 1,  # verl/utils/groupwise.py: (count - 1)
            "compute_gdpo_outcome_advantage.epsilon": 1e-6,
            "masked_whiten.eps": 1e-8,  # verl/utils/torch_functional.py
            "compute_optimal_token_baseline_advantage.handle_zero_tail": True,
            "compute_optimal_token_baseline_advantage.epsilon": 1e-8,
            "compute_policy_loss_gspo.max_seq_log_ratio": 10.0,
            "kl_penalty_forward.low_var_kl_clamp": 10.0,
        },
        clamps_log_ratio={  # torch.clamp(log_prob - old_log_prob, -20, 20) before exp
            "vanilla": True, "bypass_mode (loss_type=ppo_clip)": True, "gspo": False, "sapo": True, "cispo": True,
            "geo_mean": False, "clip_cov": False, "kl_cov": False, "dppo_tv": True, "dppo_kl": True,
            "low_var_kl / k3": True, "k3+ / low_var_kl+": True,
        },
    ),
    # The trl 1.16.0 package (the release setup.py pins); the newest git commit reached, f2cd577 of
    # 2026-07-24, predates it and still has use_bias_correction_kl=False.
    "trl": Read(
        commit=None, release="1.16.0", date="2026-10",
        defaults={
            # trl/trainer/grpo_config.py, GRPOConfig:
            "epsilon": 0.2,
            "epsilon_high": 0.2,  # None: epsilon
            "sapo_temperature_pos": 1.0,
            "sapo_temperature_neg": 1.05,
            "vespo_k_pos": 2.0,
            "vespo_lambda_pos": 3.0,
            "vespo_k_neg": 3.0,
            "vespo_lambda_neg": 2.0,
            "vllm_importance_sampling_clip_max": 3.0,
            "max_completion_length": "T",  # completions padded to it
            "use_bias_correction_kl": True,
            "delta": None,
            "off_policy_mask_threshold": None,
            "top_entropy_quantile": 1.0,
            # trl/trainer/grpo_trainer.py and trl/trainer/utils.py (nanstd):
            "advantage.eps": 1e-4,
            "nanstd.ddof": 1,
        },
        clamps_log_ratio={  # TRL takes exp of the raw log-ratio, except vespo (clamped to +-20)
            "grpo": False, "bnpo": False, "dr_grpo": False, "dapo": False, "cispo": False, "sapo": False,
            "luspo": False, "vespo": True, "token": False, "sequence": False, "delta (two-sided clipping)": False,
            "beta > 0 (KL term)": False, "False": False,
        },
    ),
    # google/tunix at c7d8950, 2026-08-21.
    "tunix": Read(
        commit="c7d8950f12a9c55a976bf2e1a0d8b447d71c20b3", release=None, date="2026-08-21",
        defaults={
            # tunix/rl/grpo/grpo_learner.py, GRPOConfig (no epsilon_high field: epsilon):
            "GRPOConfig.epsilon": 0.2,
            "GRPOConfig.epsilon_high": 0.2,
            # tunix/rl/ppo/ppo_learner.py, PPOConfig (epsilon_low / epsilon_high None: epsilon):
            "PPOConfig.gamma": 1.0,
            "PPOConfig.gae_lambda": 0.95,
            "PPOConfig.epsilon": 0.2,
            "PPOConfig.clip_range_value": 0.2,
            # tunix/rl/grpo/dapo_learner.py, DAPOConfig.overlong_buffer:
            "overlong_buffer.max_response_length": 20480,
            "overlong_buffer.overlong_buffer_length": 4096,
            # tunix/rl/algo_core.py and tunix/rl/common.py:
            "compute_advantages.eps": 1e-6,
            "compute_advantages.ddof": 1,
            "aggregate_loss.token_scale_norm": "T",  # the response length
            "aggregate_loss.token_sum_norm": "N",  # the batch size
        },
        clamps_log_ratio={
            "grpo (loss_algo='grpo')": True, "grpo (loss_algo='gspo-token')": True, "ppo": False, "low_var_kl": False,
        },
    ),
}


@dataclasses.dataclass(frozen=True)
class Default:
    """The option is the peer's default `key` (of `UPSTREAM[peer].defaults`)."""

    key: str


@dataclasses.dataclass(frozen=True)
class Form:
    """The option selects the peer's formula (a mode, a level, a missing bound), not a default value."""

    why: str


@dataclasses.dataclass(frozen=True)
class Stated:
    """A value the peer recommends or gives as an example: the row's note must say so, with the value."""

    word: str  # "recommended" or "example"
    value_text: str


_VERL_CLIP = {"eps_low": Default("actor.clip_ratio_low"), "eps_high": Default("actor.clip_ratio_high")}
_TRL_CLIP = {"eps_low": Default("epsilon"), "eps_high": Default("epsilon_high")}
_TRL_STD = {"std_ddof": Default("nanstd.ddof"), "eps": Default("advantage.eps")}
_TRL_IS = {"level": Form("token or sequence, the mode's level"), "mode": Form("truncate or mask, the mode's action"),
           "threshold": Default("vllm_importance_sampling_clip_max")}
_TRL_IS_MASK = {**_TRL_IS, "lower_threshold": Form("clip_min None: no lower bound, and a ratio is never below 0")}
_TUNIX_GRPO_CLIP = {"eps_low": Default("GRPOConfig.epsilon"), "eps_high": Default("GRPOConfig.epsilon_high")}

#: (peer, setting, value) -> {option: source}; aggregation options under the key "aggregate.<option>".
SOURCES = {
    ("verl", "adv_estimator", "gae"): {"gamma": Default("algorithm.gamma"), "lam": Default("algorithm.lam")},
    ("verl", "adv_estimator", "grpo"): {"std_ddof": Default("compute_grpo_outcome_advantage.std_ddof"),
                                        "eps": Default("compute_grpo_outcome_advantage.epsilon")},
    ("verl", "adv_estimator", "grpo_vectorized"): {
        "std_ddof": Default("group_mean_std.ddof"), "eps": Default("compute_grpo_vectorized_outcome_advantage.epsilon")},
    ("verl", "adv_estimator", "reinforce_plus_plus"): {"gamma": Default("algorithm.gamma"),
                                                       "eps": Default("masked_whiten.eps")},
    ("verl", "adv_estimator", "gdpo"): {"std_ddof": Default("compute_grpo_outcome_advantage.std_ddof"),
                                        "eps": Default("compute_gdpo_outcome_advantage.epsilon"),
                                        "whiten": Form("verl whitens over the batch's tokens")},
    ("verl", "adv_estimator", "optimal_token_baseline"): {
        "handle_zero_tail": Default("compute_optimal_token_baseline_advantage.handle_zero_tail")},
    ("verl", "policy_loss", "vanilla"): {**_VERL_CLIP, "clip_ratio_c": Default("actor.clip_ratio_c")},
    ("verl", "policy_loss", "gspo"): _VERL_CLIP,
    ("verl", "policy_loss", "sapo"): {"tau_pos": Default("actor.tau_pos"), "tau_neg": Default("actor.tau_neg")},
    ("verl", "policy_loss", "cispo"): _VERL_CLIP,
    ("verl", "policy_loss", "geo_mean"): _VERL_CLIP,
    ("verl", "policy_loss", "clip_cov"): {
        **_VERL_CLIP, "clip_cov_ratio": Default("policy_loss.clip_cov_ratio"),
        "clip_cov_lb": Default("policy_loss.clip_cov_lb"), "clip_cov_ub": Default("policy_loss.clip_cov_ub")},
    ("verl", "policy_loss", "kl_cov"): {"kl_cov_ratio": Default("policy_loss.kl_cov_ratio"),
                                        "ppo_kl_coef": Default("policy_loss.ppo_kl_coef")},
    ("verl", "policy_loss", "bypass_mode (loss_type=ppo_clip)"): {**_VERL_CLIP,
                                                                  "clip_ratio_c": Default("actor.clip_ratio_c")},
    **{("verl", "policy_loss", name): {"delta_low": Default("actor.clip_ratio_low"),
                                       "delta_high": Default("actor.clip_ratio_high"),
                                       "max_ratio": Default("actor.clip_ratio_c")} for name in ("dppo_tv", "dppo_kl")},
    ("verl", "kl_penalty", "low_var_kl / k3"): {"clamp": Default("kl_penalty_forward.low_var_kl_clamp")},
    ("verl", "kl_penalty", "k3+ / low_var_kl+"): {"clamp": Default("kl_penalty_forward.low_var_kl_clamp")},
    ("verl", "loss_agg_mode", "seq-mean-token-sum-norm"): {"max_len": Default("actor.loss_scale_factor")},
    **{("trl", "loss_type", name): _TRL_CLIP for name in ("grpo", "bnpo", "dapo", "luspo")},
    ("trl", "loss_type", "dr_grpo"): {**_TRL_CLIP, "aggregate.max_len": Default("max_completion_length")},
    ("trl", "loss_type", "cispo"): {"eps_low": Form("CISPO has no lower clip"),
                                    "eps_high": Stated("recommended", "5.0")},
    ("trl", "loss_type", "sapo"): {"tau_pos": Default("sapo_temperature_pos"),
                                   "tau_neg": Default("sapo_temperature_neg")},
    ("trl", "loss_type", "vespo"): {"k_pos": Default("vespo_k_pos"), "lambda_pos": Default("vespo_lambda_pos"),
                                    "k_neg": Default("vespo_k_neg"), "lambda_neg": Default("vespo_lambda_neg")},
    ("trl", "importance_sampling_level", "token"): _TRL_CLIP,
    ("trl", "importance_sampling_level", "sequence"): _TRL_CLIP,
    ("trl", "delta", "delta (two-sided clipping)"): {**_TRL_CLIP, "clip_ratio_c": Stated("example", "delta=3")},
    **{("trl", "scale_rewards", name): _TRL_STD for name in ("group", "batch")},
    **{("trl", "multi_objective_aggregation", name): _TRL_STD for name in ("sum_then_normalize", "normalize_then_sum")},
    ("trl", "off_policy_mask_threshold", "delta"): {"threshold": Stated("example", "0.5")},
    ("trl", "top_entropy_quantile", "rho"): {"top_quantile": Stated("recommended", "0.2")},
    ("trl", "vllm_importance_sampling_mode", "token_truncate"): _TRL_IS,
    ("trl", "vllm_importance_sampling_mode", "sequence_truncate"): _TRL_IS,
    ("trl", "vllm_importance_sampling_mode", "token_mask"): _TRL_IS_MASK,
    ("trl", "vllm_importance_sampling_mode", "sequence_mask"): _TRL_IS_MASK,
    ("tunix", "advantage_estimator", "grpo"): {"std_ddof": Default("compute_advantages.ddof"),
                                               "eps": Default("compute_advantages.eps")},
    ("tunix", "advantage_estimator", "gae"): {"gamma": Default("PPOConfig.gamma"), "lam": Default("PPOConfig.gae_lambda")},
    ("tunix", "policy_loss_fn", "grpo (loss_algo='grpo')"): _TUNIX_GRPO_CLIP,
    ("tunix", "policy_loss_fn", "grpo (loss_algo='gspo-token')"): _TUNIX_GRPO_CLIP,
    ("tunix", "policy_loss_fn", "ppo"): {"eps_low": Default("PPOConfig.epsilon"), "eps_high": Default("PPOConfig.epsilon")},
    ("tunix", "value_loss_fn", "ppo"): {"clip_range": Default("PPOConfig.clip_range_value")},
    ("tunix", "loss_agg_mode", "sequence-mean-token-scale"): {"max_len": Default("aggregate_loss.token_scale_norm")},
    ("tunix", "loss_agg_mode", "sequence-mean-token-sum-norm"): {"denominator": Default("aggregate_loss.token_sum_norm")},
    ("tunix", "overlong_buffer", "DAPO reward_shaping"): {
        "max_len": Default("overlong_buffer.max_response_length"),
        "cache_len": Default("overlong_buffer.overlong_buffer_length")},
}

ROWS = [(peer, row) for peer in sorted(peers.COVERAGE) for row in peers.coverage(peer)]


def _key(peer, row):
    return (peer, row.peer_kind, row.peer_name)


def _options(row):
    return {**row.options, **{f"aggregate.{k}": v for k, v in row.aggregation_options.items()}}


@pytest.mark.parametrize("peer", sorted(UPSTREAM))
def test_each_peer_is_pinned_where_its_defaults_were_read(peer):
    read, pinned = UPSTREAM[peer], peers.PEERS[peer]
    assert (pinned.commit, pinned.release, pinned.date) == (read.commit, read.release, read.date), (
        f"{peer} is pinned to {pinned.pin} but its defaults here were read at {read.commit or read.release}: "
        "read the defaults at the new pin and update UPSTREAM")
    assert pinned.commit is None or len(pinned.commit) == 40


@pytest.mark.parametrize("item", ROWS, ids=lambda item: "{}:{}={}".format(item[0], item[1].peer_kind, item[1].peer_name))
def test_row_options_are_the_peers_defaults_or_say_why_not(item):
    peer, row = item
    sources = SOURCES.get(_key(peer, row), {})
    options = _options(row)
    assert set(options) == set(sources), f"options {sorted(options)} but sources for {sorted(sources)}"
    for name, value in options.items():
        source = sources[name]
        if isinstance(source, Default):
            upstream = UPSTREAM[peer].defaults[source.key]
            assert value == upstream, f"{name}={value!r}, but {peer}'s {source.key} is {upstream!r} at {peers.PEERS[peer].pin}"
        elif isinstance(source, Stated):
            assert source.word in row.note.lower() and source.value_text in row.note, (
                f"{name}={value!r} is not {peer}'s default: the note must say it is {source.word} ({source.value_text})")


def test_every_source_names_a_row():
    keys = {_key(peer, row) for peer, row in ROWS}
    assert set(SOURCES) <= keys, sorted(set(SOURCES) - keys)


# ------------------------------------------------------------------- our kernels' defaults


@dataclasses.dataclass(frozen=True)
class KernelDefault:
    """Our kernel's default `param`, related by its docstring to the peer's default `key`.

    same: the docstring gives it as the peer's, and it must equal the recorded value. Otherwise the
    docstring must state the peer's value (`mention`).
    """

    kind: str
    name: str
    param: str
    peer: str
    key: str
    same: bool
    mention: str = ""


KERNEL_DEFAULTS = (
    KernelDefault("advantage", "grpo", "eps", "verl", "compute_grpo_outcome_advantage.epsilon", True),
    KernelDefault("token_advantage", "gae", "gamma", "verl", "algorithm.gamma", True),
    KernelDefault("token_advantage", "gae", "lam", "verl", "algorithm.lam", True),
    KernelDefault("token_advantage", "optimal_token_baseline", "handle_zero_tail", "verl",
                  "compute_optimal_token_baseline_advantage.handle_zero_tail", True),
    KernelDefault("token_advantage", "optimal_token_baseline", "eps", "verl",
                  "compute_optimal_token_baseline_advantage.epsilon", True),
    KernelDefault("loss", "clip_cov", "eps_low", "verl", "actor.clip_ratio_low", True),
    KernelDefault("loss", "clip_cov", "clip_cov_ratio", "verl", "policy_loss.clip_cov_ratio", True),
    KernelDefault("loss", "clip_cov", "clip_cov_lb", "verl", "policy_loss.clip_cov_lb", True),
    KernelDefault("loss", "clip_cov", "clip_cov_ub", "verl", "policy_loss.clip_cov_ub", True),
    KernelDefault("loss", "kl_cov", "kl_cov_ratio", "verl", "policy_loss.kl_cov_ratio", True),
    KernelDefault("loss", "kl_cov", "ppo_kl_coef", "verl", "policy_loss.ppo_kl_coef", False, "ppo_kl_coef=0.1"),
    KernelDefault("loss", "gmpo", "eps_low", "verl", "actor.clip_ratio_low", False, "eps_low=eps_high=0.2"),
    KernelDefault("loss", "dppo_tv", "delta_low", "verl", "actor.clip_ratio_low", True),
    KernelDefault("loss", "dppo_tv", "max_ratio", "verl", "actor.clip_ratio_c", False, "max_ratio=3.0"),
    KernelDefault("loss", "dppo_kl", "max_ratio", "verl", "actor.clip_ratio_c", False, "clip_ratio_c = 3.0"),
    KernelDefault("loss", "dro", "beta", "verl", "policy_loss.dro_beta", False, "has no default"),
    KernelDefault("loss", "ppo_clip", "clip_ratio_c", "verl", "actor.clip_ratio_c", False, "clip_ratio_c=3.0"),
    KernelDefault("loss", "gspo_token", "max_seq_log_ratio", "verl", "compute_policy_loss_gspo.max_seq_log_ratio", True),
    KernelDefault("loss", "sapo", "tau_pos", "verl", "actor.tau_pos", True),
    KernelDefault("loss", "sapo", "tau_neg", "trl", "sapo_temperature_neg", True),
    KernelDefault("loss", "vespo", "k_pos", "trl", "vespo_k_pos", True),
    KernelDefault("loss", "vespo", "lambda_neg", "trl", "vespo_lambda_neg", True),
    KernelDefault("advantage", "grpo_batch_std", "eps", "trl", "advantage.eps", True),
    KernelDefault("function", "clipped_value_loss", "clip_range", "tunix", "PPOConfig.clip_range_value", True),
    KernelDefault("function", "clipped_value_loss", "clip_range", "verl", "critic.cliprange_value", False,
                  "clip_range=0.5"),
)


def _kernel(kind, name):
    return getattr(jaxgrpo.kernels, name) if kind == "function" else jaxgrpo.get(kind, name)


@pytest.mark.parametrize("record", KERNEL_DEFAULTS, ids=lambda r: f"{r.name}.{r.param}:{r.peer}")
def test_kernel_defaults_follow_the_peer_or_say_how_they_differ(record):
    fn = _kernel(record.kind, record.name)
    ours = inspect.signature(fn).parameters[record.param].default
    upstream = UPSTREAM[record.peer].defaults[record.key]
    if record.same:
        assert ours == upstream, (f"{record.name}({record.param}={ours!r}) is documented as {record.peer}'s, "
                                  f"which is {upstream!r} at {peers.PEERS[record.peer].pin}")
    else:
        assert ours != upstream, f"{record.name}.{record.param} now equals {record.peer}'s: update its docstring"
        doc = " ".join(inspect.getdoc(fn).split())
        assert record.mention in doc, f"{record.name}'s docstring must state {record.peer}'s value ({record.mention!r})"


# ------------------------------------------------------------------ deliberate differences


def _clamps_a_log_ratio(row) -> bool:
    """Whether our kernel clamps a log-ratio at +-MAX_LOG_RATIO before exp: every ratio loss of this table and k3."""
    return (row.kind == "loss" and row.ours not in ("reinforce", "dro")) or (row.kind == "kl" and row.ours.startswith("k3"))


@pytest.mark.parametrize("item", [(p, r) for p, r in ROWS if r.ours is not None and _clamps_a_log_ratio(r)],
                         ids=lambda item: "{}:{}={}".format(item[0], item[1].peer_kind, item[1].peer_name))
def test_a_log_ratio_clamp_the_peer_lacks_is_named(item):
    peer, row = item
    clamps = UPSTREAM[peer].clamps_log_ratio
    assert row.peer_name in clamps, f"record whether {peer}'s {row.peer_name} clamps its log-ratio"
    named = any("+-20" in d for d in row.differences)
    assert named == (not clamps[row.peer_name]), (
        f"{peer}'s {row.peer_name} {'clamps' if clamps[row.peer_name] else 'does not clamp'} its log-ratio: "
        f"the row {'must not name' if clamps[row.peer_name] else 'must name'} the +-20 clamp as a difference")


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "gmpo"])
def test_the_clamp_is_named_in_the_kernel_docstring_too(name):
    doc = " ".join(inspect.getdoc(jaxgrpo.get("loss", name)).split())
    assert "clamped to +-20" in doc and "verl does not clamp it" in doc


# ----------------------------------------------------------------------------- the TRL release


def test_the_trl_table_is_read_at_the_release_setup_py_pins():
    setup = open(os.path.join(REPO_ROOT, "setup.py"), encoding="utf-8").read()
    (pinned,) = re.findall(r'"trl==([^"]+)"', setup)
    assert pinned == peers.PEERS["trl"].release == UPSTREAM["trl"].release


def test_the_recorded_trl_defaults_are_the_installed_releases():
    """Where the pinned TRL is installed (the test extras), its GRPOConfig has the defaults recorded above."""
    pytest.importorskip("trl")
    if importlib.metadata.version("trl") != UPSTREAM["trl"].release:
        pytest.skip(f"trl {importlib.metadata.version('trl')} is installed, not the pinned {UPSTREAM['trl'].release}")
    from trl import GRPOConfig

    fields = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    recorded = UPSTREAM["trl"].defaults
    assert fields["epsilon_high"] is None and recorded["epsilon_high"] == fields["epsilon"]  # None: epsilon
    for name in ("epsilon", "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos",
                 "vespo_k_neg", "vespo_lambda_neg", "vllm_importance_sampling_clip_max", "use_bias_correction_kl",
                 "delta", "off_policy_mask_threshold", "top_entropy_quantile"):
        assert fields[name] == recorded[name], f"GRPOConfig.{name} is {fields[name]!r}, recorded {recorded[name]!r}"
