"""What sampling is, shared by everything that samples: the distribution and its log-probs, the per-row keys, the
requests' checks and buckets, and the `Generation` a sampling call returns.

Sampling: temperature, then top-k, then top-p (nucleus, on the renormalized top-k distribution), then min-p, in
the order of transformers' `generate`; `greedy` takes the argmax. The log-prob reported for each token is under
exactly the distribution it was drawn from (truncated and renormalized: the behaviour policy);
`policy_logprobs` is the untruncated `log_softmax(logits / temperature)`, the quantity a trainer recomputes.
Randomness is per row: sample g of prompt b (`r = prompt_id * G + g`) draws its t-th token with
`fold_in(fold_in(key, r), t)` (`row_keys`, `step_keys`), so a row's sample does not depend on its companions.

Generation itself runs through the rollout engine (`jaxgrpo.engine`: `generate`, `generate_text`, `Engine`),
which runs the same `flax.nnx` policy the trainer differentiates (no weight copy), so the log-probs it reports
are the ones the trainer recomputes.

The package: `distribution` (the sampling distribution, behaviour log-probs, per-row keys) and `requests` (prompts
checked and bucketed, stop sets, the model's context window, `Generation`).
"""

from jaxgrpo.sampler.distribution import SamplingParams, row_keys, sample_tokens, sampling_log_probs, step_keys
from jaxgrpo.sampler.requests import (FINISH_LENGTH, FINISH_STOP, MIN_BUCKET, Generation, bucket_length,
                                      default_stop_tokens, encode_prompts, is_int_in, left_pad, model_context_window,
                                      stop_array)

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "MIN_BUCKET", "Generation", "SamplingParams", "bucket_length",
           "default_stop_tokens", "encode_prompts", "is_int_in", "left_pad", "model_context_window", "row_keys",
           "sample_tokens", "sampling_log_probs", "step_keys", "stop_array"]

# The fixed-batch sampler's names, removed on 2026-12-06 when the rollout engine became the only sampler.
_MOVED = {"generate": "jaxgrpo.engine.generate (the same arguments)",
          "generate_text": "jaxgrpo.engine.generate_text (the same arguments)",
          "compilation_counts": "jaxgrpo.engine.compilation_counts"}
_REMOVED = ("Layout", "layout_for", "prefill", "prefill_program", "decode_loop", "decode_program")


def __getattr__(name: str):
    if name in _MOVED:
        raise AttributeError(f"jaxgrpo.sampler.{name} was removed: the rollout engine is the only sampler; use "
                             f"{_MOVED[name]}")
    if name in _REMOVED:
        raise AttributeError(f"jaxgrpo.sampler.{name} (the fixed-batch sampler's program) was removed: the rollout "
                             f"engine is the only sampler; its programs are jaxgrpo.engine.programs")
    raise AttributeError(f"module 'jaxgrpo.sampler' has no attribute {name!r}")
