"""Attention implementations behind one interface, chosen by backend (`model.attention` overrides).

The decoder's training and scoring forward describes which keys each query sees with an
`AttentionLayout` (padded rows, packed segments, or packed prompt groups as a trunk and branches) and
hands it, with the queries, keys and values, to one implementation:

* `xla`: dense scores [B, kv, G, T, T] in float32, the reference and the test oracle (any backend);
* `pallas_tpu`: splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`), memory linear in
  T; on a TPU, and interpreted on a CPU (for tests: slow);
* `pallas_gpu`: our flash-attention kernel in Pallas for the Triton backend, forward and backward, memory
  linear in T; on a GPU, and interpreted on a CPU (for tests: slow);
* `cpu`: the XLA math, plus the C++ decode kernel (`cpu_attention`) for the sampler's cached steps.

`pallas_tpu` also reads cached decode steps (the sampler's, the engine's) through a Pallas kernel
(`cache_state`, `pallas_decode`) and `cpu` through a C++ one (`cpu_attention`); the others read them with the
decoder's XLA math. The rollout engine's paged pool is read in place (`paged_state`) by `pallas_tpu`'s decode
kernel and by `pallas_gpu`'s Triton one (`pallas_gpu_decode`). `flash_common` holds what the two Pallas
implementations share (the layouts as segment-id calls, their exact union, running per shard).

`default_for(platform)` picks `pallas_tpu` on a TPU, `pallas_gpu` on a GPU, `cpu` on a CPU, `xla`
elsewhere; `resolve(name, platform)` turns a configured name ("auto" or one of `NAMES`) into its
implementation, with a one-line error listing the available ones for a name that does not exist or does
not run there.

An implementation is two pure functions, so the decoder computes what the layout needs once per call and
the attention itself once per layer:

    masks = implementation.prepare(layout, positions, window)      # arrays with a leading batch axis
    out = implementation.attend(q, k, v, masks, sliding, window=..., scale=..., logit_soft_cap=..., mesh=...)

with q [B, T, kv, G, D] (G query heads per key/value head, RoPE applied), k and v [B, T, kv, D], and
`sliding` a (possibly traced) bool saying whether this layer uses the `window`. The output [B, T, kv, G, D]
is in q's dtype. Outputs at padding slots are unspecified (implementations differ there); every real
token's output, and so every gradient of a loss over real tokens, is the same.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

import jax

#: The implementations, by configured name.
NAMES = ("xla", "pallas_tpu", "pallas_gpu", "cpu")
#: The configured name that picks `default_for` the program's platform.
AUTO = "auto"


class AttentionLayout(NamedTuple):
    """Which keys each query of a training/scoring forward may see: causal in slot order, and

    * padded: `valid` bool[B, T] (True on real tokens) restricts the keys;
    * segments: `segment_ids` i32[B, T] (0 is padding) keeps packed sequences apart;
    * branches: `segment_ids` with `branch_ids` i32[B, T] (0 on a segment's shared trunk, g >= 1 on its
      g-th branch): a query sees its segment's trunk and its own branch (models/packing.py), and sliding
      windows count positions, not slots.

    Exactly one kind is set; `kind` names it (static under `jit`: it depends on which fields are None).
    """

    valid: jax.Array | None = None
    segment_ids: jax.Array | None = None
    branch_ids: jax.Array | None = None

    @property
    def kind(self) -> str:
        if self.branch_ids is not None:
            return "branches"
        return "segments" if self.segment_ids is not None else "padded"

    @classmethod
    def padded(cls, valid: jax.Array) -> AttentionLayout:
        return cls(valid=valid.astype(bool))

    @classmethod
    def segments(cls, segment_ids: jax.Array) -> AttentionLayout:
        return cls(segment_ids=segment_ids)

    @classmethod
    def branches(cls, segment_ids: jax.Array, branch_ids: jax.Array) -> AttentionLayout:
        return cls(segment_ids=segment_ids, branch_ids=branch_ids)


class AttentionImplementation(NamedTuple):
    """One attention implementation (see the module docstring).

    name: its configured name; platforms: where it runs; prepare, attend: the training/scoring attention;
    cache_state: None (the decoder's XLA math reads every cache), or a reader of a cached call's cache with a
    run-time live length, `(q, cache_k, cache_v, layer, live, key_mask, sliding, *, window, scale, query_slot,
    mesh) -> (top, total, out) or None`: the online-softmax state of the queries q [B, T, kv, G, D] over layer
    `layer`'s slots below `live` of one cache [L, R, kv, C, D] (the row cache, or a shared prefix with R
    dividing B: row b reads cache row b // (B / R)) that `key_mask` bool [R, C] keeps, query t sitting at slot
    `query_slot + t` (a layer that slides, `sliding` a bool or a traced flag, sees the last `window` slots),
    as `pallas_decode.cache_attention_state` defines it; None where it does not serve this call (the decoder's
    XLA math then reads that cache). `pallas_tpu`: its Pallas decode kernel; `cpu`: its C++ kernel where built.
    paged_state: None, or a reader of a paged pool's rows in place, `(q, pool_k, pool_v, tables, layer, lengths,
    starts, sliding, *, window, scale, query_positions, mesh) -> (top, total, out)`, as
    `pallas_decode.paged_attention_state` defines it (`pallas_tpu`: that kernel; `pallas_gpu`: `pallas_gpu_decode`'s). Where it is None the decoder
    reads a paged pool with `pallas_decode.xla_paged_attention_state` (a gather of every row's blocks: the
    reference, which the rollout engine leaves for its dense views).
    paged_attention: None, or a paged decode step's whole attention in the implementation's kernels, `(q, k, v,
    new_mask, pools, layer, sliding, *, window, scale, mesh) -> output [B, T, kv, G, D] or None`: the queries over
    the new tokens' keys and values (`new_mask` [B, T, T]: which each sees) and each of `pools`' rows (each
    (pool_k, pool_v, tables, lengths, starts), the rows' own first), merged and normalized where the decoder would
    merge `paged_state`'s states and normalize them in launches of their own (`pallas_gpu`: its kernel takes in the
    new token, continues a state and finishes); None where it does not serve the call.
    paged_writes_each: how a paged step writes its new keys and values into the pool
    (`paged_cache.write_new_tokens`): one position at a time (True: `pallas_tpu`, since a scatter lets the TPU
    compiler give the pool the layout it prefers for a scatter, and its kernel then reads a relayout copy of
    the whole pool every step) or one scatter (False: elsewhere; on a GPU the loop would be R x T iterations of a
    `while` a step, each a kernel launch and a host round trip, where the scatter is one kernel in place).
    """

    name: str
    platforms: tuple[str, ...]
    prepare: Callable[..., Any]
    attend: Callable[..., jax.Array]
    cache_state: Callable[..., tuple[jax.Array, jax.Array, jax.Array] | None] | None = None
    paged_state: Callable[..., tuple[jax.Array, jax.Array, jax.Array]] | None = None
    paged_attention: Callable[..., jax.Array | None] | None = None
    paged_writes_each: bool = False


def get(name: str) -> AttentionImplementation:
    """The implementation called `name` (one of `NAMES`)."""
    if name not in NAMES:
        raise ValueError(f"unknown attention implementation {name!r}; choose one of {', '.join((AUTO,) + NAMES)}")
    return importlib.import_module(f"{__name__}.{name}").IMPLEMENTATION


def available(platform: str) -> tuple[str, ...]:
    """The implementations that run on `platform` ("cpu", "gpu", "tpu")."""
    return tuple(name for name in NAMES if platform in get(name).platforms)


def default_for(platform: str) -> str:
    """The implementation `auto` picks on `platform`: splash attention on a TPU, the Pallas flash kernel on a
    GPU, the CPU kernels on a CPU."""
    return {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cpu": "cpu"}.get(platform, "xla")


def check_name(name: str) -> None:
    """Raises the one-line error of `get` for a name that is neither "auto" nor an implementation."""
    if name != AUTO:
        get(name)


def resolve(name: str, platform: str) -> AttentionImplementation:
    """The implementation a configured `name` ("auto" or one of `NAMES`) runs on `platform`."""
    if name == AUTO:
        name = default_for(platform)
    implementation = get(name)
    if platform not in implementation.platforms:
        raise ValueError(f"attention implementation {name!r} does not run on {platform}; available there: "
                         f"{', '.join((AUTO,) + available(platform))}")
    return implementation


def target_platform(mesh) -> str:
    """The platform a program laid out on `mesh` (None: the default devices) runs on. A CPU process can
    compile for a TPU topology (`jaxgrpo.tools.compile`): the mesh's devices, not the default backend, decide."""
    device = getattr(mesh, "abstract_device", None)  # an AbstractMesh (as under `jit`) names its devices' kind
    if device is not None:
        return device.platform
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh.devices.flat[0].platform
    return jax.default_backend()


def with_window(run: Callable[[int | None], Any], sliding, window: int | None):
    """`run(window)` for a layer that slides, `run(None)` for one that does not (`sliding`: a bool, or the layer
    scan's traced flag: both are traced and one runs, `lax.cond`); `run(None)` where the model has no window."""
    if not window:
        return run(None)
    if isinstance(sliding, bool):
        return run(window if sliding else None)
    return jax.lax.cond(sliding, lambda: run(window), lambda: run(None))


def paged_at_windows(state: Callable[..., Any], q, pool_k, pool_v, tables, layer, lengths, starts, sliding, *,
                     window: int | None, scale: float, query_positions=None):
    """A paged kernel's state (`state`: `pallas_decode.paged_attention_state`'s signature, its mesh bound) of the
    queries over each row's positions [starts, lengths), a sliding layer's only the last `window` before each query
    (`with_window`): the body of an implementation's `paged_state`."""

    def run(window):
        return state(q, pool_k, pool_v, tables, layer, lengths, scale, starts=starts, window=window,
                     query_positions=query_positions)

    return with_window(run, sliding, window)
