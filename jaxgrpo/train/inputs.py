"""Everything known about a batch's rows and tokens, by name: the inputs a kernel can ask for.

A kernel reads the fields its signature names (`fields_read`): `grpo(rewards, group_ids, *,
num_groups, valid)` reads four; `stratified_grpo` also reads `strata_ids`. `FIELDS` declares each
field once: its shape, and what provides it in a run (always the trainer, a config setting, the
task's examples) or, for a field nothing in this library provides, what would. A kernel asking for
a field the run cannot provide is refused before the first step (`check_fields`), with the field
and its provider named.

`BatchInputs` holds the host-side fields of one step's whole batch (every host the same);
`loss` fields are computed inside the jitted update for the micro-batch being scored.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import numpy as np

from jaxgrpo import kernels

if TYPE_CHECKING:  # a type only: the config validates its stages (`check_config`), not the other way round
    from jaxgrpo.config.fields import Config

ROW, GROUP, TOKEN, STATIC, LOSS = "row [N]", "group [num_groups]", "token [N, T]", "static int", "loss (in the update)"
STEP = "step [S] (one row per policy turn of an episode)"


def _always(cfg: Config, examples) -> bool:
    return True


def _environment(cfg: Config, examples) -> bool:
    return cfg.environment is not None


def _task_key(key: str) -> Callable[[Config, Any], bool]:
    def provides(cfg: Config, examples) -> bool:
        return bool(len(examples)) and all(key in e for e in examples)

    return provides


class Field(NamedTuple):
    """One input a kernel can read: its shape, what it is, and what provides it."""

    shape: str
    what: str
    provider: str  # what provides it (or would: for fields no part of this library provides)
    #: (cfg, the task's training examples) -> whether the run provides it; None: nothing in this library's loop does
    available: Callable[[Config, Any], bool] | None


#: Every field a kernel may name, with its provider.
FIELDS: dict[str, Field] = {
    # Rows: outcomes of the step's completions.
    "rewards": Field(ROW, "weighted sum of the rewards, after reward shaping", "the reward functions", _always),
    "correct": Field(ROW, "the correctness reward", "cfg.correctness_reward", _always),
    "accuracy": Field(ROW, "the correctness reward (as accuracy)", "cfg.correctness_reward", _always),
    "group_ids": Field(ROW, "prompt group of each row", "the sampler", _always),
    "num_groups": Field(STATIC, "groups in the batch", "cfg.prompts_per_step", _always),
    "valid": Field(ROW, "rows that train (scored, of groups kept by dynamic sampling)", "the sampler", _always),
    "lengths": Field(ROW, "completion tokens", "the sampler", _always),
    "seq_logp": Field(ROW, "mean sampler log-prob per completion token", "the sampler", _always),
    "reward_weights": Field("[K]", "weight of each reward function (rewards are then [N, K])", "cfg.rewards",
                            _always),
    "success_rates": Field(GROUP, "mean correctness of each group", "cfg.correctness_reward", _always),
    "strata_ids": Field(ROW, "stratum of each row's prompt", "the task: examples with a 'strata_id' key",
                        _task_key("strata_id")),
    "bundle_ids": Field(ROW, "bundle of each row's prompt", "the task: examples with a 'bundle_id' key",
                        _task_key("bundle_id")),
    # Steps: an environment run's policy turns (an advantage kernel reading one runs on the step rows).
    "anchor_ids": Field(STEP, "the environment state each turn acts from", "cfg.environment (its episodes' states)",
                        _environment),
    "num_anchors": Field(STATIC, "the range of anchor_ids", "cfg.environment (its episodes' states)", _environment),
    "step_returns": Field(STEP, "discounted return from each turn (cfg.environment.discount)",
                          "cfg.environment (its episodes' turn rewards)", _environment),
    "consistency": Field(ROW, "reasoning-answer consistency", "a consistency judge (GRPO-CARE's reference model)", None),
    "wins": Field("[N, N]", "pairwise preference outcomes", "a pairwise preference judge (Pref-GRPO's reward model)",
                  None),
    "reference_accuracy": Field(ROW, "a reference model's accuracy on the prompt",
                                "rollouts of a reference model (AdaptThink)", None),
    "no_thinking": Field(ROW, "the completion skipped thinking", "a thinking / no-thinking chat template (AdaptThink)",
                         None),
    "exit_mask": Field("[N, K]", "early exits of a reasoning path", "serial early-exit rollouts (S-GRPO)", None),
    "mean_abs_advantage": Field("[D]", "running mean |A| per data distribution",
                                "statistics over several datasets across steps (DUMP's curriculum)", None),
    "counts": Field("[D]", "samples drawn per data distribution",
                    "statistics over several datasets across steps (DUMP's curriculum)", None),
    # Tokens (host side, before the update).
    "mask": Field(TOKEN, "completion tokens that train", "the sampler", _always),
    "sampler_logp": Field(TOKEN, "log-prob of each token under the sampling policy", "the sampler", _always),
    "trainer_logp": Field(TOKEN, "log-prob of each token under the trainer's forward pass", "a forward pass", _always),
    "token_rewards": Field(TOKEN, "the reward on each completion's last token", "the reward functions", _always),
    "values": Field(TOKEN, "value of each token", "cfg.value_head", lambda cfg, examples: cfg.value_head),
    "token_logprobs": Field("[N, T, V]", "log-probs over the whole vocabulary",
                            "a forward pass materializing [N, T, V] (the trainer scores tokens in vocabulary chunks)",
                            None),
    "probe_probs": Field(TOKEN, "answer probability probed at each step", "a probing pass (GRPO-VPS)", None),
    "process_rewards": Field(TOKEN, "reward of each reasoning step", "a process reward model", None),
    "step_mask": Field(TOKEN, "tokens ending a reasoning step", "a process reward model's step segmentation", None),
    "segment_ids": Field(TOKEN, "reasoning segment of each token", "a probing pass (GRPO-VPS)", None),
    "boundaries": Field(TOKEN, "segment boundaries", "a segmenter of reasoning steps", None),
    "hits": Field("[N, K]", "relevance of each ranked item", "a ranking task (Rank-GRPO)", None),
    "baseline": Field(ROW, "tracked value of each row's prompt (SPO)",
                      "cfg.value_tracker (SPO's value tracker, its state kept in the train state)",
                      lambda cfg, examples: cfg.value_tracker is not None),
    "baseline_rewards": Field(ROW, "reward of a greedy completion of each row's prompt",
                              "a greedy-baseline rollout per prompt (ReMax)", None),
    "sum_pi_squared": Field(TOKEN, "sum over the vocabulary of pi^2 at each token",
                            "a forward pass over the whole vocabulary (optimal token baseline)", None),
    # Inside the update, for the micro-batch being scored.
    "logp": Field(LOSS, "log-prob of each token under the policy being trained", "the update", _always),
    "old_logp": Field(LOSS, "log-prob of each token under the sampling policy", "the sampler", _always),
    "advantages": Field(LOSS, "advantage of each token", "the advantage stage", _always),
    "entropy": Field(LOSS, "entropy of the policy at each token", "the update", _always),
    "prefix_mask": Field(LOSS, "tokens of an off-policy refinement prefix",
                         "critique-guided refinements (Critique-GRPO)", None),
}

#: Loss-stage fields that are per-row arrays carried into the update (the rest are computed there).
LOSS_ROW_FIELDS = ("rewards", "group_ids", "valid")


def _is_field(p: inspect.Parameter) -> bool:
    """A parameter named like a field is one unless its default is a setting (a string, number or flag):
    a field is an array, required or defaulting to None, while e.g. OPMD's `baseline="mean"` is a choice."""
    return p.name in FIELDS and (p.default is p.empty or p.default is None)


def fields_read(kernel: Callable, kwargs: dict = ()) -> tuple[list[str], list[str]]:
    """(required, optional) fields a kernel's signature names, less the keyword arguments the experiment sets."""
    required, optional = [], []
    for p in inspect.signature(kernel).parameters.values():
        if _is_field(p) and p.name not in kwargs:
            (required if p.default is p.empty else optional).append(p.name)
    return required, optional


def hyperparameters(kernel: Callable) -> list[str]:
    """The keyword arguments an experiment may set: every parameter that is not a field."""
    return [p.name for p in inspect.signature(kernel).parameters.values()
            if not _is_field(p) and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def unavailable(name: str, cfg: Config, examples) -> str | None:
    """Why the run (its config and the task's training examples) cannot provide field `name` (None when it can)."""
    field = FIELDS[name]
    if field.available is None:
        return f"{name} ({field.what}), which only {field.provider} provides and jaxgrpo's loop has none"
    if not field.available(cfg, examples):
        return f"{name} ({field.what}), which {field.provider} provides and this run does not"
    return None


def loop_support(kernel: Callable) -> str | None:
    """Why a kernel cannot run in jaxgrpo's loop whatever the experiment says (a field nothing provides), or None."""
    required, _ = fields_read(kernel)
    missing = [n for n in required if FIELDS[n].available is None]
    if missing:
        return "needs " + "; ".join(f"{n}, which only {FIELDS[n].provider} provides" for n in missing)
    return None


#: The fields of an environment run's steps: an advantage kernel reading one runs on the step rows.
STEP_FIELDS = ("anchor_ids", "num_anchors", "step_returns")


class Steps(NamedTuple):
    """The policy turns of a batch of environment episodes, one step row each (S of them), and the way back
    from step rows to the episodes' tokens."""

    rows: np.ndarray  # i32[S] the batch row (episode) of each step
    turns: np.ndarray  # i32[S] its turn in the episode, from 0
    step_returns: np.ndarray  # f32[S] discounted return from the turn: sum_k discount^k r_{turn + k}
    anchor_ids: np.ndarray  # i32[S] the state the turn acts from, numbered over the batch
    token_turns: np.ndarray  # i32[N, T] the turn of each completion token (-1 past the episode's end)

    @classmethod
    def of_episodes(cls, turn_rewards, anchors, token_turns: np.ndarray, discount: float) -> "Steps":
        """Steps of episodes given per row: `turn_rewards[n]` and `anchors[n]` (hashable states), one per turn."""
        rows, turns, states = [], [], []
        for row, (rewards, row_anchors) in enumerate(zip(turn_rewards, anchors, strict=True)):
            if len(rewards) != len(row_anchors):
                raise ValueError(f"episode {row} has {len(rewards)} turn rewards but {len(row_anchors)} anchor states")
            rows += [row] * len(rewards)
            turns += range(len(rewards))
            states += row_anchors
        rows, turns = np.asarray(rows, np.int32), np.asarray(turns, np.int32)
        # Per-turn rewards laid out [episodes, turns]: the returns are the reward-to-go over each episode's turns.
        per_turn = np.zeros((len(turn_rewards), int(turns.max(initial=-1)) + 1), np.float32)
        per_turn[rows, turns] = [r for rewards in turn_rewards for r in rewards]
        taken = np.zeros(per_turn.shape, bool)
        taken[rows, turns] = True
        returns = np.asarray(kernels.discounted_returns(per_turn, taken, gamma=discount))[rows, turns]
        numbering: dict = {}
        anchor_ids = [numbering.setdefault(state, len(numbering)) for state in states]
        return cls(rows, turns, returns.astype(np.float32), np.asarray(anchor_ids, np.int32),
                   np.asarray(token_turns, np.int32))

    def to_tokens(self, values: np.ndarray) -> np.ndarray:
        """f32[N, T]: each completion token gets the value of its episode's step (its turn); 0 past the end."""
        num_steps, width = len(self.rows), int(self.turns.max(initial=-1)) + 1
        step_of = np.full((self.token_turns.shape[0], max(width, 1)), num_steps)  # num_steps: the 0 appended
        step_of[self.rows, self.turns] = np.arange(num_steps)
        turn = np.clip(self.token_turns, 0, max(width, 1) - 1)
        step = np.where(self.token_turns >= 0, np.take_along_axis(step_of, turn, axis=1), num_steps)
        return np.append(np.asarray(values, np.float32), np.float32(0))[step]


class BatchInputs(NamedTuple):
    """The host-side fields of one step's whole batch (numpy; the same on every host).

    Row fields [N], token fields [N, T]; `task_ids` holds the task-provided per-row ids
    (`strata_ids`, `bundle_ids`) the task's examples carry. Absent fields are None.
    """

    rewards: np.ndarray
    reward_columns: np.ndarray  # f32[N, K] one column per reward function
    reward_weights: np.ndarray  # f32[K]
    correct: np.ndarray
    group_ids: np.ndarray
    num_groups: int
    valid: np.ndarray
    lengths: np.ndarray
    seq_logp: np.ndarray
    mask: np.ndarray | None
    sampler_logp: np.ndarray | None
    trainer_logp: np.ndarray | None
    values: np.ndarray | None
    task_ids: dict
    steps: Steps | None = None  # an environment run's policy turns

    def of_steps(self) -> "BatchInputs":
        """The batch as step rows (`steps`): each turn takes its episode's row fields (its reward is the
        episode's), and the step fields; token fields are absent."""
        if self.steps is None:
            raise ValueError("the step fields (anchor_ids, step_returns) exist only in an environment run; set "
                             "cfg.environment")
        rows = self.steps.rows
        return BatchInputs(
            rewards=self.rewards[rows], reward_columns=self.reward_columns[rows], reward_weights=self.reward_weights,
            correct=self.correct[rows], group_ids=self.group_ids[rows], num_groups=self.num_groups,
            valid=self.valid[rows], lengths=self.lengths[rows], seq_logp=self.seq_logp[rows], mask=None,
            sampler_logp=None, trainer_logp=None, values=None,
            task_ids={**{k: v[rows] for k, v in self.task_ids.items()}, "anchor_ids": self.steps.anchor_ids,
                      "num_anchors": int(self.steps.anchor_ids.max(initial=0)) + 1,
                      "step_returns": self.steps.step_returns})

    def get(self, name: str):
        """Field `name` of the batch (derived fields computed here)."""
        if name in ("correct", "accuracy"):
            return self.correct
        if name == "success_rates":
            sums = np.bincount(self.group_ids, self.correct * self.valid, minlength=self.num_groups)
            counts = np.bincount(self.group_ids, self.valid.astype(np.float32), minlength=self.num_groups)
            return (sums / np.maximum(counts, 1)).astype(np.float32)
        if name == "token_rewards":
            token_rewards = np.zeros_like(self.mask)
            last = np.maximum(self.mask.sum(-1).astype(np.int32) - 1, 0)
            token_rewards[np.arange(len(last)), last] = self.rewards * self.valid
            return token_rewards
        if name in self.task_ids:
            return self.task_ids[name]
        return getattr(self, name)


def call(kernel: Callable, inputs: BatchInputs, kwargs: dict, **given):
    """Calls `kernel` with the fields it reads from `inputs` (or `given`), then the experiment's `kwargs`.

    A kernel reading `reward_weights` gets the rewards as [N, K] columns, one per reward function (GDPO).
    """
    required, optional = fields_read(kernel, kwargs)
    arguments = {}
    for name in required + optional:
        value = given[name] if name in given else inputs.get(name)
        if value is None and name in optional:
            continue
        arguments[name] = value
    if "reward_weights" in arguments and "rewards" in arguments:
        arguments["rewards"] = inputs.reward_columns
    arguments = {k: v if FIELDS[k].shape == STATIC else jax.numpy.asarray(v) for k, v in arguments.items()}
    return kernel(**arguments, **kwargs)
