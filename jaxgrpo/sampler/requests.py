"""What a generation request is and returns: prompts checked (one-line errors) and left-padded to power-of-two
buckets, stop sets, the model's context window, and the `Generation` a sampling call returns."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import numpy as np

FINISH_STOP = 1
"""`finish_reason` of a row that produced one of the stop tokens (the stop token is kept, masked in)."""
FINISH_LENGTH = 2
"""`finish_reason` of a row that reached `max_new_tokens` without a stop token."""

MIN_BUCKET = 16


def is_int_in(value, low: int, high: int | None = None) -> bool:
    """Whether `value` is an integer (Python or NumPy; not a bool) in [low, high] (no upper bound without `high`):
    the check of every count and index argument of the sampler and the engine."""
    return (not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= low
            and (high is None or value <= high))


def bucket_length(length: int, minimum: int = MIN_BUCKET) -> int:
    """The static size a length is padded to: the smallest power of two >= max(length, minimum)."""
    length = max(int(length), int(minimum), 1)
    return 1 << (length - 1).bit_length()


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token id lists to `length`: `(tokens int32[B, length], mask bool[B, length])`."""
    tokens = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), bool)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            tokens[row, length - len(prompt):] = prompt
            mask[row, length - len(prompt):] = True
    return tokens, mask


def check_prompts(prompts, vocab_size: int, context_window: int | None, max_new_tokens: int = 0) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) and not isinstance(prompts, np.ndarray):
        raise TypeError(f"prompts must be a list of token id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; pass at least one prompt")
    checked = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            raise TypeError(f"prompts[{i}] is a string; tokenize it first or use jaxgrpo.engine.generate_text")
        ids = [int(t) for t in np.asarray(prompt).reshape(-1)]
        if not ids:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token (e.g. BOS)")
        if context_window is not None and len(ids) + max_new_tokens > context_window:
            # Positions past the window mean nothing to the model: its rows would run on garbage, silently.
            from jaxgrpo.errors import ConfigError

            raise ConfigError(
                f"prompts[{i}] has {len(ids)} tokens, and with max_new_tokens={max_new_tokens} its row needs "
                f"{len(ids) + max_new_tokens} positions, more than the model's context window of {context_window} "
                f"(context_window); truncate the prompt or lower max_new_tokens"
                + (f" (to at most {context_window - len(ids)})" if context_window > len(ids) else "")
            )
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab_size:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab_size}): min {low}, max {high}")
        checked.append(ids)
    return checked


def stop_array(stop_tokens: Sequence[int]) -> np.ndarray:
    """The stop set as int32 [S], S a power of two >= 8 padded with -1 (never a token), so
    changing the stop set does not recompile."""
    stop = sorted({int(t) for t in stop_tokens})
    out = np.full(bucket_length(len(stop), 8), -1, np.int32)
    out[: len(stop)] = stop
    return out


def model_context_window(model, context_window: int | None = None) -> int | None:
    """`context_window` if given, else the model's (its config's `max_position_embeddings`, `context_window`
    or `max_seq_len`), else None (unknown: not checked)."""
    if context_window is not None:
        return int(context_window)
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "context_window", "max_seq_len"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    return None


class Generation(NamedTuple):
    """What `jaxgrpo.engine.generate` returns; rows are prompt-major (row `b * G + g` is sample g of prompt b).

    Attributes:
      prompt_tokens: int32 [B*G, P], the left-padded prompts actually used (P the prompt bucket).
      prompt_mask: bool [B*G, P], True on real prompt tokens.
      completion_tokens: int32 [B*G, N] (N = max_new_tokens), `pad_id` after a row finished.
      completion_mask: bool [B*G, N], True on generated tokens, the stop token included.
      logprobs: float32 [B*G, N], log-prob of each token under the exact distribution it was
        sampled from (after temperature and truncation; 0 for greedy), 0 where masked out.
      policy_logprobs: float32 [B*G, N], `log_softmax(logits / temperature)` of each token, no
        truncation: what a trainer recomputes on the same sequences; 0 where masked out.
      finish_reason: int32 [B*G], `FINISH_STOP` or `FINISH_LENGTH`.
      prompt_index: int32 [B*G], the index of each row's prompt in the batch (the group id).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    completion_tokens: jax.Array
    completion_mask: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    finish_reason: jax.Array
    prompt_index: jax.Array


def default_stop_tokens(tokenizer) -> list[int]:
    """The tokenizer's EOS plus the end-of-turn markers of common chat templates it knows."""
    stop = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        stop.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for marker in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>"):
        if marker in vocab:
            stop.add(int(vocab[marker]))
    return sorted(stop)


def encode_prompts(tokenizer, prompts, *, chat_template: bool | None = None) -> list[list[int]]:
    """Token ids of each prompt: a string or a list of chat messages (`{"role", "content"}` dicts).

    With the chat template (the default when the tokenizer has one) a string is a single user
    turn and the template's generation prompt is appended; without it a string is encoded as is.
    """
    has_template = getattr(tokenizer, "chat_template", None) is not None
    use_template = has_template if chat_template is None else chat_template
    encoded = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str) and not use_template:
            encoded.append(list(tokenizer(prompt)["input_ids"]))
            continue
        if not has_template:
            raise ValueError(f"prompts[{i}] needs a chat template but the tokenizer has none; pass chat_template=False and strings")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        encoded.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return encoded
