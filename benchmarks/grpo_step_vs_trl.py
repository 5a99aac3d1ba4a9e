"""One GRPO step, jaxgrpo against TRL's GRPOTrainer, on the same CPU, weights, prompts, reward and settings.

    pip install -e '.[bench]'   # torch (CPU), trl, datasets
    python benchmarks/grpo_step_vs_trl.py [--pairs 4] [--threads 2] [--out benchmarks/results/grpo_step_vs_trl.json]

The step: 8 prompts of the arithmetic task (its chat prompts rendered with SmolLM2's template), G=4
completions each, at most 128 new tokens (both stop at end of turn), scored by
`jaxgrpo.rewards.correctness_reward`, GRPO advantages, one optimizer update (AdamW) of all 135M
float32 parameters of SmolLM2-135M-Instruct, dequantized from the same Q4_1 GGUF file on both sides.

Both frameworks run in this one process, on the same cores: the process is pinned to `--threads`
cores (`sched_setaffinity`), torch uses `torch.set_num_threads(threads)` and XLA runs with
`--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=threads`. TRL's own training loop
runs `trainer.train()`; after each of its optimizer steps a callback runs one jaxgrpo
`Trainer.step`, so the steps alternate T J T J ... and slow drift of the machine's load hits
both. Step k of each side sees the same 8 prompts. TRL's first step (allocation) and jaxgrpo's first
step (XLA compilation of the sampler and the update) are reported apart; steady state is the median
over the following pairs, with the median of the per-pair ratios. On a machine shared with other
jobs, `--threads 1` keeps both frameworks' thread pools from waiting on descheduled peer threads
(benchmarks/run_all.sh uses it); the results JSON is rewritten after every pair.

Settings made equal (TRL name = jaxgrpo name): learning_rate = optimizer.lr = 1e-6, constant
schedule, AdamW betas (0.9, 0.999), weight decay 0, max_grad_norm = 1.0; temperature 1.0, top-k/top-p
off; beta = kl_coef = 0; epsilon = eps_low = 0.2; loss_type "dapo" (TRL's default) = aggregation
"token_mean" with the whole batch in one update; scale_rewards "group" (TRL's default) = advantage
"grpo" with the unbiased group std and eps 1e-4; float32 (bf16=False) on both sides; each side's
default and fastest memory setting: TRL without gradient checkpointing, jaxgrpo with layer
rematerialization (remat=True, same gradients; on this CPU it is faster than storing the activations,
see benchmarks/profile_step.py); per_device_train_batch_size = 32 completions, one gradient accumulation
step (`--micro-batch 8`: 8 completions per forward/backward on both sides, gradients accumulated
exactly over the 32; TRL: per_device_train_batch_size=8, gradient_accumulation_steps=4).

Correctness cross-check (`loss_parity`): on one batch (the completions jaxgrpo sampled in its first
step, old log-probs = those of the sampler perturbed so that some ratios leave [0.8, 1.2], the same
rewards) and the initial weights, jaxgrpo's loss (the trainer's own loss function) is compared with
TRL's `GRPOTrainer.compute_loss`; advantages from `jaxgrpo.kernels.grpo` with TRL's formula (group
mean, `trl.trainer.utils.nanstd`, + 1e-4).
"""

from __future__ import annotations

import argparse
import os


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4, help="timed steady-state T/J pairs after the first (warm-up) pair")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="cores both frameworks use")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="completions per forward/backward on both sides (exact gradient accumulation); default all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/grpo_step_vs_trl.json")
    parser.add_argument("--parity-only", action="store_true", help="only the loss cross-check (no timing)")
    return parser.parse_args(argv)


def pin_threads(threads: int) -> None:
    """Same cores for both frameworks; must run before jax (XLA reads its flags at import)."""
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    cpus = sorted(os.sched_getaffinity(0))
    if threads > len(cpus):
        raise ValueError(f"--threads={threads} but this process may only use {len(cpus)} cores")
    os.sched_setaffinity(0, cpus[:threads])
    flags = f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()


if __name__ == "__main__":
    ARGS = parse_args()
    pin_threads(ARGS.threads)

import copy  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxgrpo import kernels  # noqa: E402
from jaxgrpo.config import Config  # noqa: E402
from jaxgrpo.models import registry  # noqa: E402
from jaxgrpo.rewards import correctness_reward  # noqa: E402

MODEL = "smollm2-135m-instruct"
LR, TEMPERATURE, EPSILON, ADVANTAGE_EPS, MAX_GRAD_NORM, BETAS = 1e-6, 1.0, 0.2, 1e-4, 1.0, (0.9, 0.999)


# -- the two setups ------------------------------------------------------------------------


def jaxgrpo_config(prompts: int, group_size: int, max_new_tokens: int, seed: int, micro_batch: int | None = None) -> Config:
    """jaxgrpo's settings equal to TRL's GRPOConfig below (see the module docstring)."""
    c = Config()
    c.model = MODEL
    c.task.name = "arithmetic"
    c.task.num_eval_examples = 0
    c.rewards = {"correctness_reward": 1.0}
    c.advantage, c.advantage_kwargs = "grpo", {"std_ddof": 1, "eps": ADVANTAGE_EPS}
    c.loss, c.loss_kwargs = "ppo_clip", {"eps_low": EPSILON}
    c.aggregation = "token_mean"
    c.kl_coef = 0.0
    c.prompts_per_step, c.group_size = prompts, group_size
    c.sampling.temperature, c.sampling.max_new_tokens = TEMPERATURE, max_new_tokens
    c.optimizer.lr, (c.optimizer.b1, c.optimizer.b2) = LR, BETAS
    c.optimizer.weight_decay, c.optimizer.warmup_steps, c.optimizer.max_grad_norm = 0.0, 0, MAX_GRAD_NORM
    c.micro_batch_size = micro_batch
    c.seed = seed
    c.checkpoint_every, c.eval_every = 0, 0
    return c


def trl_reward(completions, question, answer, **unused):
    """`jaxgrpo.rewards.correctness_reward` in TRL's reward signature (conversational completions)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    examples = [{"question": q, "answer": a} for q, a in zip(question, answer)]
    return correctness_reward(texts, examples).tolist()


trl_reward.__name__ = "correctness_reward"


def load_torch_model():
    """SmolLM2-135M-Instruct from the same GGUF as jaxgrpo, dequantized to float32 by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = registry.resolve(MODEL)
    directory, name = os.path.dirname(path), os.path.basename(path)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # The GGUF loader marks the model as quantized; the weights are already float32, and TRL refuses to
    # train a model that still carries a quantization config.
    model.hf_quantizer.remove_quantization_config(model)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    return model, tokenizer


def trl_trainer(model, tokenizer, examples, task, args, output_dir: str, callbacks=()):
    """TRL's GRPOTrainer over `examples` in order (step k sees examples[k*prompts:(k+1)*prompts])."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    batch = args.prompts * args.group_size
    micro = args.micro_batch or batch
    if batch % micro:
        raise ValueError(f"--micro-batch={micro} must divide prompts x group size = {batch}")
    dataset = Dataset.from_list([{"prompt": task.messages(e), "question": e["question"], "answer": e["answer"]}
                                 for e in examples])
    config = GRPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, gradient_checkpointing=False,
        # One generation of prompts x G completions and one optimizer step per TRL step; with a micro-batch,
        # the accumulation steps split the same generation batch (loss_type "dapo" normalizes over all of it).
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        num_generations=args.group_size, max_completion_length=args.max_new_tokens,
        temperature=TEMPERATURE, top_k=0, top_p=1.0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=BETAS[0], adam_beta2=BETAS[1],
        weight_decay=0.0, max_grad_norm=MAX_GRAD_NORM, beta=0.0, epsilon=EPSILON, loss_type="dapo",
        scale_rewards="group", num_iterations=1, shuffle_dataset=False, seed=args.seed,
        max_steps=len(examples) // args.prompts, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False,
    )
    return GRPOTrainer(model=model, reward_funcs=[trl_reward], args=config, train_dataset=dataset,
                       processing_class=tokenizer, callbacks=list(callbacks))


# -- the correctness cross-check ---------------------------------------------------------------


def loss_parity(jax_trainer, jax_params, trl, rollout, *, perturbation: float = 0.3, seed: int = 0) -> dict:
    """jaxgrpo's GRPO loss vs TRL's `compute_loss` on the same batch and weights.

    Args:
      jax_trainer: a `jaxgrpo.train.Trainer` (its config gives loss, aggregation and advantage).
      jax_params: the jaxgrpo parameters to evaluate (the same weights as TRL's model).
      trl: a `GRPOTrainer` whose model holds the same weights.
      rollout: a `jaxgrpo.train.Trajectories` (completions, sampler log-probs, rewards).
      perturbation: std of the noise added to the sampler's log-probs to make the old log-probs, so
        that ratios leave the clip range and the clipped branch is compared too.
    """
    import torch

    from jaxgrpo.train.step import make_loss_fn
    from trl.trainer.utils import nanstd

    cfg = jax_trainer.cfg
    g = cfg.group_size
    mask = rollout.completion_mask.astype(np.float32)
    noise = np.random.default_rng(seed).normal(0.0, perturbation, mask.shape).astype(np.float32)
    old_logp = ((rollout.sampler_logp + noise) * mask).astype(np.float32)
    rollout = rollout._replace(sampler_logp=old_logp)

    # Advantages: jaxgrpo's registered estimator and TRL's formula on the same rewards.
    batch = jax_trainer.advantages(jax_trainer.loop_state, rollout)
    advantages = batch.advantages[:, 0]  # per row, broadcast over its tokens
    rewards = torch.tensor(rollout.rewards)
    mean = rewards.view(-1, g).mean(1).repeat_interleave(g)
    std = nanstd(rewards.view(-1, g), dim=1).repeat_interleave(g)
    trl_advantages = ((rewards - mean) / (std + ADVANTAGE_EPS)).numpy()

    # jaxgrpo: the trainer's own loss function on the trainer's batch layout.
    loss_fn = jax.jit(make_loss_fn(cfg, jax_trainer.graphdef, jax_trainer.rest))
    denominator = kernels.aggregation_denominator(batch.completion_mask, cfg.aggregation)
    ours, metrics = loss_fn(jax_params, jax.tree.map(jnp.asarray, batch), denominator)

    # TRL: compute_loss on the inputs its _generate_and_score_completions would hand it.
    model = trl.model
    model.train()
    if not hasattr(trl, "current_gradient_accumulation_steps"):
        trl.current_gradient_accumulation_steps = trl.args.gradient_accumulation_steps  # set by train() otherwise
    inputs = {
        "prompt_ids": torch.tensor(rollout.prompt_tokens, dtype=torch.long),
        "prompt_mask": torch.tensor(rollout.prompt_mask, dtype=torch.long),
        "completion_ids": torch.tensor(rollout.completion_tokens, dtype=torch.long),
        "completion_mask": torch.tensor(mask, dtype=torch.long),
        "old_per_token_logps": torch.tensor(old_logp),
        "advantages": torch.tensor(trl_advantages),
        "num_items_in_batch": torch.tensor(mask.sum()),
    }
    with torch.no_grad():
        theirs = trl.compute_loss(model, inputs)
    result = {
        "jaxgrpo_loss": float(ours),
        "trl_loss": float(theirs),
        "abs_diff": abs(float(ours) - float(theirs)),
        "advantage_max_abs_diff": float(np.abs(advantages - trl_advantages).max()),
        "clip_fraction": float(metrics["clip_fraction"]),
        "tokens": int(mask.sum()),
        "trl_loss_type": trl.loss_type,
        "trl_scale_rewards": trl.scale_rewards,
        "jaxgrpo_aggregation": cfg.aggregation,
    }
    result["passed"] = result["abs_diff"] <= 1e-4 and result["advantage_max_abs_diff"] <= 1e-5
    return result


def weight_max_abs_diff(jax_trainer, torch_model) -> float:
    """Largest difference between the two dequantizations of the GGUF (the token embedding)."""
    decoder = jax_trainer.policy.decoder
    embed = np.asarray(decoder.embed[...])
    diff = np.abs(embed - torch_model.model.embed_tokens.weight.detach().numpy()).max()
    return float(diff)


# -- the benchmark ------------------------------------------------------------------------------


def versions() -> dict:
    import accelerate
    import flax
    import torch
    import transformers
    import trl

    return {"jax": jax.__version__, "flax": flax.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "trl": trl.__version__, "accelerate": accelerate.__version__,
            "python": platform.python_version()}


def main(args) -> None:
    import torch
    from transformers import TrainerCallback

    from jaxgrpo.train import Trainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = jaxgrpo_config(args.prompts, args.group_size, args.max_new_tokens, args.seed, args.micro_batch)
    ours = Trainer(cfg, reward_fns=[(correctness_reward, 1.0)])
    initial_params = jax.tree.map(jnp.copy, ours.state.params)  # the update donates the state
    steps = 1 + (0 if args.parity_only else args.pairs)
    examples = [ours.prompts._dataset[i] for i in range(steps * args.prompts)]  # jaxgrpo's prompt order

    torch_model, tokenizer = load_torch_model()
    initial_torch = copy.deepcopy(torch_model.state_dict())
    weights_diff = weight_max_abs_diff(ours, torch_model)
    # Same prompt tokens: TRL renders the conversation with the same chat template.
    rendered = tokenizer.apply_chat_template(ours.task.messages(examples[0]), tokenize=False, add_generation_prompt=True)
    same_prompt = list(tokenizer(rendered, add_special_tokens=False)["input_ids"]) == ours.prompt_ids(examples[0])

    record: dict = {"trl": [], "jaxgrpo": []}
    captured = {}
    rollout_fn = ours.rollout

    def rollout_and_keep(state, key=None):
        out = rollout_fn(state, key)
        captured.setdefault("rollout", out[0])
        return out

    ours.rollout = rollout_and_keep

    class Alternate(TrainerCallback):
        """After each TRL step, one jaxgrpo step; times each side's wall clock between the switches."""

        def on_train_begin(self, *unused, **unused_kw):
            self.mark = time.perf_counter()

        def on_step_end(self, *unused, **unused_kw):
            if args.parity_only:
                return
            now = time.perf_counter()
            trl_row = {"seconds": now - self.mark, **timing.pop()}
            record["trl"].append(trl_row)
            step = len(record["jaxgrpo"])
            start = time.perf_counter()
            ours.loop_state, metrics = ours.step(ours.loop_state)  # its step `step`
            jax.block_until_ready(ours.state.params)
            seconds = time.perf_counter() - start
            record["jaxgrpo"].append({"seconds": seconds, "generate_seconds": metrics["time_sample"],
                                      "train_seconds": metrics["time_train"], "tokens": metrics["sampled_tokens"],
                                      "reward": metrics["reward_mean"]})
            print(f"step {step}: TRL {trl_row['seconds']:.1f} s ({trl_row['tokens']} tokens), "
                  f"jaxgrpo {seconds:.1f} s ({metrics['sampled_tokens']} tokens)", flush=True)
            write_results(args, record, parity=None, weights_diff=weights_diff, same_prompt=same_prompt, final=False)
            self.mark = time.perf_counter()

    timing = _GenerationTimer()
    with tempfile.TemporaryDirectory() as output_dir:
        trl = trl_trainer(torch_model, tokenizer, examples, ours.task, args, output_dir, callbacks=[Alternate()])
        timing.wrap(trl)
        if not args.parity_only:
            trl.train()
        else:
            key_ = jax.random.key(args.seed)
            captured["rollout"] = ours.rollout(ours.loop_state, key_)[0]
        # The cross-check runs on the initial weights of both sides.
        torch_model.load_state_dict(initial_torch)
        parity = loss_parity(ours, initial_params, trl, captured["rollout"], seed=args.seed)
    print(f"loss cross-check: jaxgrpo {parity['jaxgrpo_loss']:.8f}, TRL {parity['trl_loss']:.8f}, "
          f"|diff| {parity['abs_diff']:.2e} (clip fraction {parity['clip_fraction']:.2f}); "
          f"advantages |diff| {parity['advantage_max_abs_diff']:.1e}: {'PASS' if parity['passed'] else 'FAIL'}")

    write_results(args, record, parity=parity, weights_diff=weights_diff, same_prompt=same_prompt, final=True)


def summarize(record: dict) -> dict:
    """Medians of the steady-state steps (all but the first of each side) and the per-pair ratios."""
    trl_steady = [r["seconds"] for r in record["trl"][1:]]
    jax_steady = [r["seconds"] for r in record["jaxgrpo"][1 : len(record["trl"])]]
    ratios = [t / j for t, j in zip(trl_steady, jax_steady)]
    if not ratios:
        return {}
    out = {
        "trl_first_step_seconds": record["trl"][0]["seconds"],
        "jaxgrpo_first_step_seconds": record["jaxgrpo"][0]["seconds"],
        "trl_median_seconds": statistics.median(trl_steady),
        "jaxgrpo_median_seconds": statistics.median(jax_steady),
        "speedup_median_of_pairs": statistics.median(ratios),
        "pair_ratios": ratios,
    }
    # Compilation: the first step's excess over the steady state.
    out["jaxgrpo_compile_seconds"] = out["jaxgrpo_first_step_seconds"] - out["jaxgrpo_median_seconds"]
    for side in ("trl", "jaxgrpo"):
        for part in ("generate_seconds", "tokens"):
            out[f"{side}_median_{part}"] = statistics.median(r[part] for r in record[side][1 : len(ratios) + 1])
    return out


def write_results(args, record, *, parity, weights_diff, same_prompt, final: bool) -> None:
    """Writes the JSON (after every pair too, so an interrupted run keeps what it measured)."""
    result = {
        "benchmark": "grpo_step_vs_trl", "threads": args.threads, "prompts": args.prompts,
        "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "micro_batch": args.micro_batch,
        "versions": versions(),
        "weights_max_abs_diff": weights_diff, "same_prompt_tokens": bool(same_prompt), "parity": parity,
        "complete": final, "steps": record, **summarize(record),
    }
    if final and "speedup_median_of_pairs" in result:
        print(f"\nsteady state (median of {len(result['pair_ratios'])} pairs): TRL {result['trl_median_seconds']:.1f} s/step, "
              f"jaxgrpo {result['jaxgrpo_median_seconds']:.1f} s/step, speedup {result['speedup_median_of_pairs']:.2f}x "
              f"(goal >= 3x); jaxgrpo first step {result['jaxgrpo_first_step_seconds']:.1f} s "
              f"(~{result['jaxgrpo_compile_seconds']:.1f} s compilation)")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if final:
        print(f"wrote {args.out}")


class _GenerationTimer:
    """Times TRL's generation and counts its completion tokens, per step (wraps the trainer's `_generate`)."""

    def __init__(self):
        self.current = {"generate_seconds": 0.0, "tokens": 0}

    def wrap(self, trainer) -> None:
        generate = trainer._generate

        def timed(prompts):
            start = time.perf_counter()
            out = generate(prompts)
            self.current["generate_seconds"] += time.perf_counter() - start
            self.current["tokens"] += sum(len(ids) for ids in out[1])
            return out

        trainer._generate = timed

    def pop(self) -> dict:
        current, self.current = self.current, {"generate_seconds": 0.0, "tokens": 0}
        return current


if __name__ == "__main__":
    main(ARGS)
