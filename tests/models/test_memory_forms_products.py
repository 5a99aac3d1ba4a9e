"""The memory forms' weight products (`MemoryForms.product`) in a bfloat16 model: the accelerators' return the model's
dtype (`memory_forms.product_in_dtype`), so the backward pass multiplies bfloat16 cotangents by bfloat16 operands,
where a float32 result (`float32_product`, the CPU forms') makes every backward product a float32 one; values and
gradients are the same."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.extend.core import jaxprs_in_params

from jaxgrpo.models import Decoder, DecoderConfig, backend, cpu_forms, memory_forms
from jaxgrpo.models.layers import _product

FLOAT32_PRODUCTS = memory_forms.PLAIN._replace(product=memory_forms.float32_product)
QWEN3 = DecoderConfig(family="qwen3", vocab_size=53, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True)


def test_products_in_dtype_equal_float32_products_rounded_in_values_and_gradients():
    # Small integers: every sum of products is exact in float32 whatever order a CPU's kernel adds them in (XLA:CPU
    # multiplies bfloat16 -> float32 and bfloat16 -> bfloat16 through different kernels), so the only rounding is
    # the one to bfloat16 (sums past 256 need it), and the two forms must agree to the bit.
    keys = jax.random.split(jax.random.key(0), 3)
    x, weight, cotangent = (jax.random.randint(key, shape, -8, 9).astype(jnp.bfloat16)
                            for key, shape in zip(keys, ((2, 5, 32), (32, 4, 16), (2, 5, 4, 16))))

    def run(forms):
        out, pullback = jax.vjp(lambda x, w: _product("btd,dhk->bthk", x, w, jnp.bfloat16, forms), x, weight)
        return [out, *pullback(cotangent)]

    want = run(FLOAT32_PRODUCTS)
    for forms in (memory_forms.PLAIN, memory_forms.GPU, cpu_forms.FORMS):
        for name, a, b in zip(("out", "dx", "dw"), want, run(forms)):
            assert a.dtype == b.dtype == jnp.bfloat16
            np.testing.assert_array_equal(np.asarray(b, np.float32), np.asarray(a, np.float32), err_msg=name)


def _product_operand_dtypes(forms, monkeypatch) -> set[tuple[str, ...]]:
    """The operand dtypes of every matrix product in the jaxpr of a bfloat16 Qwen3's loss gradient traced with
    `forms` and the GPU's attention (`pallas_gpu`, whose kernels' products are in it too, as are the log-prob
    head's)."""
    monkeypatch.setattr(backend, "memory_for_program", lambda: forms)
    graphdef, params = nnx.split(Decoder(QWEN3, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, attention="pallas_gpu",
                                         rngs=nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, QWEN3.vocab_size)

    def loss(p):
        logprobs, _ = nnx.merge(graphdef, p).token_logprobs(tokens, jnp.roll(tokens, -1, 1),
                                                            attention_mask=jnp.ones(tokens.shape, bool))
        return logprobs.sum()

    found = set()

    def walk(jaxpr):
        for equation in jaxpr.eqns:
            if equation.primitive.name == "dot_general":
                found.add(tuple(str(v.aval.dtype) for v in equation.invars))
            for inner in jaxprs_in_params(equation.params):
                walk(inner)

    walk(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    return found


def test_the_accelerators_backward_products_are_bfloat16(monkeypatch):
    # The premise: with float32 results the backward multiplies float32 cotangents (XLA converts the other operand).
    assert ("float32", "bfloat16") in _product_operand_dtypes(FLOAT32_PRODUCTS, monkeypatch)
    for forms in (memory_forms.PLAIN, memory_forms.GPU):
        assert _product_operand_dtypes(forms, monkeypatch) == {("bfloat16", "bfloat16")}, forms.name
