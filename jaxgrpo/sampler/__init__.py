"""Batched generation with a KV cache: G completions per prompt from the policy being trained.

The sampler runs the same `flax.nnx` policy the trainer differentiates (split into graph and
state, merged inside `jax.jit`), so there is no weight copy and the log-probs it reports are the
ones the trainer recomputes (kvfrans/lmpo does the same).

How a batch of B prompts becomes B*G completions (`G = num_samples`, `P` the prompt bucket,
`N` the completion bucket, `C = P + N` the context capacity):

1. prompts are left-padded to `P`, the smallest power of two >= 16 holding the longest one;
   positions count real tokens, so padding changes nothing but the shapes;
2. **prefill** (one jitted call): the B prompts run once into a [layers, B, P, ...] prompt cache,
   stored once and shared by the prompt's G rows (row `b * G + g` is sample g of prompt b); the
   first completion token is sampled from the last prompt position's logits;
3. **decode** (one jitted call, the carry donated): a `lax.while_loop` feeds each row's last
   token at slot `t` of the rows' [layers, B*G, N, ...] completion cache, writing its keys and
   values with `dynamic_update_slice` in place, until every row has produced a stop token or
   `max_new_tokens` tokens exist. Attention reads each prompt's keys once per step for its G rows
   (the decoder's `prefix=`): the prompt's cache is stored and read once instead of G times.

Sampling: temperature, then top-k, then top-p (nucleus, on the renormalized top-k distribution),
then min-p, in the order of transformers' `generate`; `greedy` takes the argmax. The log-prob
reported for each token is under exactly the distribution it was drawn from (truncated and
renormalized); `policy_logprobs` is the untruncated `log_softmax(logits / temperature)`, the
quantity a trainer recomputes. Randomness is per row: row `r = prompt_id * G + g` draws step t
with `fold_in(fold_in(key, r), t)`, so a row's sample does not depend on its batch companions.

Shapes are bucketed (prompt length and completion length to powers of two >= 16), so a run
compiles a bounded number of times; `compilation_counts()` reports how many.

The trainer samples through the rollout engine (`jaxgrpo.engine`), which shares this package's distribution,
requests and `Generation`; in a multi-process run each process's engine samples its own prompts on its own
devices. `generate` is the fixed batch, one program over one process's devices.

The package: `distribution` (the sampling distribution, behaviour log-probs, per-row keys), `requests` (prompts
checked and bucketed, stop sets, `Generation`: shared with the rollout engine) and `fixed_batch` (the programs and
`generate`).
"""

from jaxgrpo.sampler.distribution import SamplingParams, row_keys, sample_tokens, sampling_log_probs, step_keys
from jaxgrpo.sampler.fixed_batch import (Layout, compilation_counts, decode_loop, decode_program, generate,
                                         generate_text, layout_for, prefill, prefill_program)
from jaxgrpo.sampler.requests import (FINISH_LENGTH, FINISH_STOP, MIN_BUCKET, Generation, bucket_length,
                                      default_stop_tokens, encode_prompts, is_int_in, left_pad, model_context_window,
                                      stop_array)

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "MIN_BUCKET", "Generation", "Layout", "SamplingParams", "bucket_length",
           "compilation_counts", "decode_loop", "decode_program", "default_stop_tokens", "encode_prompts", "generate",
           "generate_text", "is_int_in", "layout_for", "left_pad", "model_context_window", "prefill", "prefill_program",
           "row_keys", "sample_tokens", "sampling_log_probs", "step_keys", "stop_array"]
