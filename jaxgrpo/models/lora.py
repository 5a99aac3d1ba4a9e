"""LoRA and QLoRA on the decoder's projections, with qwix (Google's JAX library for quantization and LoRA).

LoRA ("LoRA: Low-Rank Adaptation of Large Language Models", Hu et al. 2021) trains, beside a frozen projection
weight W, two small matrices A [in, r] and B [r, out] and multiplies by W + (alpha / r) A B; B starts at zero, so
the adapted model starts as the base. QLoRA ("QLoRA: Efficient Finetuning of Quantized LLMs", Dettmers et al.
2023) stores W quantized (4-bit NormalFloat in blocks of 64, or int8) and trains the same adapters over it.

`apply(model, rank=..., alpha=..., targets=..., quantize_base=...)` adapts a `Decoder` with qwix:

* **The products are qwix's.** `qwix.apply_lora_to_model` intercepts the decoder's layer scan `_layers`, which
  both entry points run (`forward`: training, scoring; `decode_step`: the sampler's and the engine's prefill and
  decode steps; qwix intercepts one method of an nnx model), so each projection's `einsum` runs through
  qwix's `LoraProvider`: the base product (qwix's quantized einsum for QLoRA) plus qwix's low-rank one. Nothing
  of the decoder is rewritten; the sampler samples from the adapted policy in the same graph as the trainer.
* **The adapters and the quantized weights are created here, stacked over the layers.** qwix creates both on a
  first eager call of the model, one module at a time; this decoder runs its layers as one `lax.scan` over
  stacked weights, where a module is a fresh view each trace, so that call cannot keep what it creates. So the
  adapters are made as qwix would make them (its `LoraRule`'s initializers: A He-uniform per layer, B zeros; its
  names `<weight>_lora_a` / `_lora_b`; `nnx.LoRAParam`; A over the weight's contracted axes, B over the others)
  with a leading layer axis and logical axes for the mesh, and each quantized weight is what qwix's own PTQ
  provider makes of the whole stack's product (`qwix.quantize_model`), kept in the form qwix multiplies by.
* **Only the projections named in `targets` get adapters** (`ProjectionLoraProvider`): qwix's rules select
  modules by path, and this decoder keeps q, k, v and o in one module.

The adapted model's trainable state is its `nnx.LoRAParam`s; everything else is read-only. `adapters_off` zeroes
them: the base model, with no second copy of its weights (the KL reference).
"""

from __future__ import annotations

import inspect
import math
import string
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import qwix
from flax import nnx

from jaxgrpo.models.config import PROJECTIONS
from jaxgrpo.models.decoder import Decoder
from jaxgrpo.models.partitioning import DEFAULT_RULES, Rules, logical_to_mesh_spec, variable_sharding

#: What a LoRA run may adapt: every projection weight of the decoder's blocks.
TARGETS = tuple(PROJECTIONS)
#: How the base weights may be stored under QLoRA: qwix's int8 (per output channel) or 4-bit NormalFloat.
QUANTIZATIONS = ("int8", "nf4")
#: NormalFloat-4 scales blocks of this many weights along the contracted axis (QLoRA's block size).
NF4_BLOCK = 64
#: Where the adapted products are: the modules of the stacked block (qwix module paths).
MODULE_PATH = r"layers/(attn|mlp)"


class LoraSettings(NamedTuple):
    """How a model was adapted (kept on it as `model.lora`): the adapters' rank and alpha (they scale by
    alpha / rank), the projections adapted, and the base weights' quantization (None: as loaded)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    quantize_base: str | None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def check(rank: int, alpha: float, targets: Sequence[str], quantize_base: str | None) -> None:
    """Raises ValueError (one line naming the value and what is valid) for settings `apply` cannot use."""
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"lora.targets has {', '.join(map(repr, unknown))}, which is not a projection of the decoder; "
                         f"valid targets: {', '.join(TARGETS)}")
    if not targets:
        raise ValueError(f"lora.targets is empty: name the projections to adapt, some of {', '.join(TARGETS)}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"lora.targets names a projection twice: {', '.join(targets)}")
    if rank <= 0:
        raise ValueError(f"lora.rank must be >= 1 (the adapters' inner dimension), got {rank}")
    if not alpha > 0:
        raise ValueError(f"lora.alpha must be > 0 (the adapters are scaled by alpha / rank), got {alpha}")
    if quantize_base is not None and quantize_base not in QUANTIZATIONS:
        raise ValueError(f"lora.quantize_base must be none (the base as loaded) or one of "
                         f"{', '.join(map(repr, QUANTIZATIONS))} (the base stored quantized by qwix), got {quantize_base!r}")


def apply(model: Decoder, *, rank: int, alpha: float, targets: Sequence[str] = TARGETS,
          quantize_base: str | None = None, seed: int = 0, key: jax.Array | None = None) -> Decoder:
    """`model` adapted with LoRA on `targets` (a copy sharing its weights; see the module docstring).

    Args:
      model: the decoder to adapt (left as it is).
      rank, alpha: the adapters' rank r and scale alpha (each adapted product adds (alpha / r) x A B).
      targets: projection names of `TARGETS`.
      quantize_base: None, or "int8" / "nf4": every projection weight (adapted or not) stored quantized by qwix.
      seed: the adapters' initialization (A per layer; B is zero), used as `jax.random.key(seed)`.
      key: the adapters' initialization as a key instead (a run's "adapters" stream, `jaxgrpo.rng`).

    Returns an nnx model whose `nnx.LoRAParam`s are the adapters; `model.lora` holds the settings.
    """
    targets = tuple(targets)
    check(rank, alpha, targets, quantize_base)
    model = nnx.clone(model)
    layers = model.layers
    if quantize_base:
        for name, projection in PROJECTIONS.items():
            module = getattr(layers, projection.module)
            setattr(module, name, _quantized(getattr(module, name), projection, quantize_base))
    rule = qwix.LoraRule(module_path=MODULE_PATH, op_names=("einsum",), rank=rank, alpha=float(alpha),
                         weight_qtype=quantize_base)
    key = jax.random.key(seed) if key is None else key
    for name in targets:
        projection = PROJECTIONS[name]
        module = getattr(layers, projection.module)
        shape = _shape(getattr(module, name))
        a, b = _adapters(shape, projection, rank, rule, jax.random.fold_in(key, TARGETS.index(name)))
        setattr(module, f"{name}_lora_a", a)
        setattr(module, f"{name}_lora_b", b)
    provider = ProjectionLoraProvider([rule])
    # The model is not called here (skip_nnx_init): its adapters and quantized weights exist already.
    adapted = qwix.apply_lora_to_model(model, provider, jnp.zeros((1, 1), jnp.int32), methods=("_layers",),
                                       rngs=nnx.Rngs(key), skip_nnx_init=True)
    adapted.lora = LoraSettings(rank, float(alpha), targets, quantize_base)
    return adapted


def settings(model) -> LoraSettings | None:
    """How `model` (a decoder) was adapted, or None for a model without adapters."""
    return getattr(model, "lora", None)


def _shape(weight) -> tuple[int, ...]:
    return tuple(weight.shape) if not isinstance(weight, nnx.Variable) else tuple(weight.get_value().shape)


def _adapters(shape: tuple[int, ...], projection, rank: int, rule: qwix.LoraRule, key) -> tuple:
    """(A, B) for a stacked weight of `shape` [layers, *contracted, *out]: A [layers, *contracted, rank] from the
    rule's initializer, one draw per layer as qwix draws one per module; B [layers, rank, *out] zero. Float32,
    whatever the model's dtype: the adapters are what trains."""
    layers, contracted, out = shape[0], shape[1:1 + projection.contracted], shape[1 + projection.contracted:]
    a = jax.vmap(lambda k: rule.lora_a_initializer(k, (*contracted, rank), jnp.float32))(jax.random.split(key, layers))
    b = jnp.zeros((layers, rank, *out), jnp.float32)
    axes_in, axes_out = projection.axes[:projection.contracted], projection.axes[projection.contracted:]
    return (nnx.LoRAParam(a, logical_axes=("layers", *axes_in, "lora_rank")),
            nnx.LoRAParam(b, logical_axes=("layers", "lora_rank", *axes_out)))


class _StackedProduct(nnx.Module):
    """A projection's product over all layers at once (layer axis `l` batched): what qwix's PTQ provider sees to
    decide how to quantize the whole stack, per layer and output channel over the contracted axes."""

    def __init__(self, weight: nnx.Param, spec: str):
        self.weight = weight
        self.spec = spec

    def __call__(self, x):
        return jnp.einsum(self.spec, x, self.weight[...])


def _quantized(weight: nnx.Param, projection, qtype: str):
    """`weight` [layers, *contracted, *out] as qwix's PTQ provider stores it for the product x @ weight (a
    `WithAux` of a `qwix.QArray`: values and per-channel (int8) or per-block (nf4) scales), unboxed: the form
    qwix multiplies by, which a product must be handed as it is."""
    value = weight[...]
    contracted = projection.contracted
    letters = string.ascii_lowercase[1:]
    inputs, outputs = letters[:contracted], letters[contracted:len(value.shape) - 1]
    spec = f"lz{inputs},l{inputs}{outputs}->lz{outputs}"
    last = value.shape[contracted]
    tile = NF4_BLOCK if qtype == "nf4" and last % NF4_BLOCK == 0 else None
    rule = qwix.QuantizationRule(module_path=".*", weight_qtype=qtype, tile_size=tile)
    example = jnp.zeros((value.shape[0], 1, *value.shape[1:1 + contracted]), value.dtype)
    product = qwix.quantize_model(_StackedProduct(weight, spec), qwix.PtqProvider([rule]), example)
    return product.weight.value


def is_quantized(weight) -> bool:
    """Whether a projection weight is stored quantized (qwix's `WithAux` of a `QArray`)."""
    return isinstance(getattr(weight, "array", None), qwix.QArray)


def dequantized(weight) -> jax.Array:
    """A projection weight as floats: a parameter's value, or a quantized weight dequantized."""
    if is_quantized(weight):
        return qwix.dequantize(weight.array)
    return weight[...] if isinstance(weight, nnx.Variable) else weight


def _current_module() -> nnx.Module | None:
    """The innermost nnx module whose method is running (qwix's notion of the module a product belongs to)."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, nnx.Module):
            return owner
        frame = frame.f_back
    return None


def _projection_of(module: nnx.Module | None, operand) -> str | None:
    """The name of `module`'s projection weight that `operand` is (by identity), or None (an activation)."""
    if module is None:
        return None
    for name in PROJECTIONS:
        weight = module.__dict__.get(name)
        if weight is None:
            continue
        stored = weight.get_value() if isinstance(weight, nnx.Variable) else weight
        if stored is operand:
            return name
    return None


class ProjectionLoraProvider(qwix.LoraProvider):
    """qwix's `LoraProvider`, applied to exactly the projection weights that carry adapters.

    qwix matches a rule to every product of a module whose path matches, and finds the weight a product multiplies
    by among the module's parameters by identity or, failing that, by shape. This decoder's attention module holds
    q, k, v and o (k and v of one shape) and also multiplies activations (the attention scores), so its products
    are sorted out here first, by identity: a projection with adapters goes to qwix's LoRA einsum (with the quantized
    base product under QLoRA), a projection without them to qwix's PTQ einsum (the quantized or plain product), an
    activation to the plain einsum.
    """

    def einsum(self, einsum_str, *operands, **kwargs):
        module = _current_module()
        name = _projection_of(module, operands[-1]) if len(operands) == 2 else None
        if name is None:
            return jnp.einsum(einsum_str, *operands, **kwargs)
        if hasattr(module, f"{name}_lora_a"):
            return super().einsum(einsum_str, *operands, **kwargs)
        return qwix.PtqProvider.einsum(self, einsum_str, *operands, **kwargs)


def adapters_off(params):
    """`params` (a state holding `nnx.LoRAParam`s, e.g. the trained part of an adapted policy) with every adapter
    zero: multiplied by them, the adapted model is exactly its base."""
    def off(variable):
        if isinstance(variable, nnx.LoRAParam):
            return variable.replace(jnp.zeros_like(variable.get_value()))
        return variable

    return jax.tree.map(off, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def trainable():
    """The nnx filter of what trains in an adapted policy: its adapters, and a value head (PPO) if it has one."""
    return nnx.Any(nnx.LoRAParam, nnx.PathContains("value_head"))


def adapters_of(model) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{target: (A [layers, *contracted, rank], B [layers, rank, *out])} of an adapted decoder, as numpy float32."""
    out = {}
    for name in settings(model).targets:
        module = getattr(model.layers, PROJECTIONS[name].module)
        out[name] = tuple(np.asarray(getattr(module, f"{name}_lora_{ab}")[...], np.float32) for ab in "ab")
    return out


def delta(a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """scale x A B [layers, *contracted, *out] of stacked adapters A [layers, *contracted, r], B [layers, r, *out]."""
    layers, rank = a.shape[0], a.shape[-1]
    product = a.reshape(layers, -1, rank) @ b.reshape(layers, rank, -1)
    return scale * product.reshape(layers, *a.shape[1:-1], *b.shape[2:])


def merged_params(model, *, adapters: bool = True) -> dict:
    """The decoder's parameters as a nested dict of float32 numpy arrays with every projection merged:
    W + (alpha / r) A B, W dequantized where it is stored quantized (what the adapted model multiplies by); with
    `adapters=False` the base's W alone. A model without adapters gives its own parameters."""
    # The parameters but the adapters; quantized projections are not parameters and are set below.
    base = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), nnx.to_pure_dict(base))
    lora = settings(model)
    if lora is None:
        return params
    found = adapters_of(model) if adapters else {}
    for name, projection in PROJECTIONS.items():
        module = getattr(model.layers, projection.module)
        weight = np.asarray(dequantized(getattr(module, name)), np.float32)
        if name in found:
            weight = weight + delta(*found[name], lora.scale)
        # Under QLoRA a module may have no parameter left (attention without q/k norms): its entry starts here.
        params["layers"].setdefault(projection.module, {})[name] = weight
    return params


def shardings(state, mesh, rules: Rules = DEFAULT_RULES):
    """`NamedSharding`s in the structure of `state` (an adapted decoder's state, or any part of it): a variable's
    from its logical axes (`partitioning.variable_sharding`), a quantized weight's arrays (values and scales, of
    its rank) from the logical axes of the projection they store, each dimension split where its size allows."""
    def place(path, leaf):
        if isinstance(leaf, nnx.Variable):
            return variable_sharding(leaf, mesh, rules)
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        projection = next((PROJECTIONS[n] for n in reversed(names) if n in PROJECTIONS), None)
        if projection is None or len(leaf.shape) != len(projection.axes) + 1:
            raise ValueError(f"no layout for {jax.tree_util.keystr(path)} {leaf.shape}: not a quantized projection")
        return jax.sharding.NamedSharding(mesh, logical_to_mesh_spec(("layers", *projection.axes), leaf.shape, mesh,
                                                                     rules))

    return jax.tree_util.tree_map_with_path(place, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard(model, mesh, rules: Rules = DEFAULT_RULES):
    """Lays an adapted decoder's state out on `mesh` (in place; returns the model): `partitioning.shard_model` for
    a model whose quantized weights are not variables."""
    variables = nnx.state(model, nnx.Variable)
    nnx.update(model, jax.device_put(variables, shardings(variables, mesh, rules)))
    # A quantized weight is replaced whole: nnx.update cannot write into qwix's QArray (an immutable pytree node).
    for name, projection in PROJECTIONS.items():
        module = getattr(model.layers, projection.module)
        weight = getattr(module, name)
        if is_quantized(weight):
            placed = shardings({"layers": {projection.module: {name: weight}}}, mesh, rules)
            setattr(module, name, jax.device_put(weight, placed["layers"][projection.module][name]))
    return model


def num_adapter_params(model) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
