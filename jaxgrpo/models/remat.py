"""What a rematerialized layer keeps for its backward pass: the decoder's named activations and the policies over
them (`Decoder(remat=...)`, `Config.remat` and `Config.remat_policy`).

A rematerialized layer (`jax.checkpoint`) stores its input and recomputes the rest of its forward pass in the
backward pass. A policy keeps some of the layer's activations as well, by the names the blocks give them
(`jax.ad_checkpoint.checkpoint_name`), trading memory for recomputation:

* "full": the layer's input only. Every product runs twice (forward, then again in the backward), so a step
  does 8 N FLOPs a token instead of 6 N; the least memory.
* "save_attention": also the q, k and v projections, the attention's output and the output projection; from the
  flash kernels (`flash_common.lse_union`) also their residuals, the output in the kernels' layout and its
  log-sum-exp. The backward recomputes the MLP's products and element-wise work (norms, RoPE), not the
  attention's kernels (the XLA attention's probabilities, [T, T] a head, are recomputed: the CPU's training
  attention is that math too). The output is kept in both layouts: a kernel that runs per shard
  (`flash_common.per_shard`, under any mesh) returns it through a `shard_map` the backward would otherwise rerun
  whole to get it.
* "save_projections": also the MLP's gate and up projections: no product is recomputed, only element-wise work,
  6 N FLOPs a token, for 2 q + 2 kv + hidden + 2 intermediate values a token a layer in the compute dtype
  (q: query heads x head_dim, kv: key/value heads x head_dim; Qwen3-0.6B in bfloat16: 26.6 KB), where no remat
  at all also stores the norms' and RoPE's float32 intermediates.
"""

from __future__ import annotations

import jax
from jax.ad_checkpoint import checkpoint_name

#: The activations a block names (`jaxgrpo.models.layers`, `flash_common.lse_union`).
QKV = "qkv"  # the q, k and v projections (with their biases), before the norms and RoPE
ATTENTION = "attention"  # the attention's output and, from the flash kernels, their residuals
ATTENTION_OUT = "attention_out"  # the output projection
MLP_HIDDEN = "mlp_hidden"  # the MLP's gate and up projections, before the activation

#: Policy name -> the named activations it keeps besides the layer's input.
POLICIES = {
    "full": (),
    "save_attention": (QKV, ATTENTION, ATTENTION_OUT),
    "save_projections": (QKV, ATTENTION, ATTENTION_OUT, MLP_HIDDEN),
}


def name(x: jax.Array, tag: str) -> jax.Array:
    """`x` named `tag` for a remat policy (the identity otherwise)."""
    return checkpoint_name(x, tag)


def check_policy(policy: str) -> None:
    """A ValueError naming the policies where `policy` is none of them."""
    if policy not in POLICIES:
        raise ValueError(f"unknown remat policy {policy!r}; choose one of {', '.join(POLICIES)}")


def checkpointed(fn, policy: str, prevent_cse: bool = False):
    """`fn` rematerialized, keeping the activations `POLICIES[policy]` names. `prevent_cse`: keep XLA from merging
    the recomputation with the forward pass it repeats (`jax.checkpoint`'s; a scan's body needs none)."""
    check_policy(policy)
    saved = POLICIES[policy]
    return jax.checkpoint(fn, prevent_cse=prevent_cse,
                          policy=jax.checkpoint_policies.save_only_these_names(*saved) if saved else None)
