"""jaxgrpo.profiling: exclusive times from nested trace events, scope labels, and a real traced step."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxgrpo import profiling, sampler
from jaxgrpo.models import Decoder, DecoderConfig

CONFIG = DecoderConfig(family="llama", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=True)


def _event(op, ts, dur, tid=1, module="m"):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": op, "args": {"hlo_op": op, "hlo_module": module}}


def test_exclusive_times_subtract_nested_events_once():
    events = [
        _event("while", 0, 100),  # contains a (10..40) which contains b (20..30), and c (50..60)
        _event("a", 10, 30),
        _event("b", 20, 10),
        _event("c", 50, 10),
        _event("d", 200, 5),  # after the while: not nested
        _event("e", 15, 70, tid=2),  # another thread: never nested in thread 1's events
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 999, "name": "ThunkExecutor::Execute", "args": {}},
    ]
    totals = profiling.exclusive_times(events)
    assert totals == {("m", "while"): 100 - 30 - 10, ("m", "a"): 30 - 10, ("m", "b"): 10, ("m", "c"): 10,
                      ("m", "d"): 5, ("m", "e"): 70}


@pytest.mark.parametrize("op_name, label", [
    ("jit(step)/layers/while/body/attention/qkv/dot_general", "attention q/k/v projections (+ RoPE, q/k norm)"),
    ("jit(step)/layers/while/body/attention/core/bkqd,bksd->bkqs/dot_general", "attention scores, softmax and values (cache reads)"),
    ("jit(step)/transpose(jvp(layers))/while/body/mlp/dot_general", "MLP (gate, up, down) (backward)"),
    ("jit(step)/layers/while/body/jit(dynamic_index_in_dim)/dynamic_slice", "layer weights sliced out of the stack (scan)"),
    ("jit(step)/while/body/sampling/reduce_max", "sampling (temperature, truncation, draw)"),
    ("jit(step)/embedding_bag/gather", "other"),  # "embed" only as a whole path component
    ("", "other"),
])
def test_label_of_takes_the_first_matching_scope(op_name, label):
    assert profiling.label_of(op_name) == label


def test_op_names_read_the_metadata_of_every_instruction():
    text = ('%fusion.3 = f32[2]{0} fusion(%p), kind=kLoop, metadata={op_name="jit(f)/mlp/mul" stack_frame_id=3}\n'
            '  ROOT %dot.1 = f32[2,2]{1,0} dot(%a, %b), metadata={op_name="jit(f)/attention/qkv/dot_general"}\n'
            '  %param.1 = f32[2]{0} parameter(0)\n')
    assert profiling.op_names(text) == {"fusion.3": "jit(f)/mlp/mul", "dot.1": "jit(f)/attention/qkv/dot_general"}


def test_a_traced_training_step_is_attributed_to_the_decoders_parts():
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, CONFIG.vocab_size)

    def loss(p):
        logp, _ = nnx.merge(graphdef, p).token_logprobs(tokens, jnp.roll(tokens, -1, 1))
        return -logp.mean()

    compiled = jax.jit(jax.grad(loss)).lower(params).compile()
    breakdown = profiling.time_by_scope(compiled, (params,), calls=2)
    labels = set(breakdown.seconds)
    for part in ("MLP (gate, up, down)", "attention q/k/v projections (+ RoPE, q/k norm)",
                 "MLP (gate, up, down) (backward)", "layer weights sliced out of the stack (scan)"):
        assert part in labels, f"{part} missing from {sorted(labels)}"
    # The rematerialized head runs inside the backward pass.
    assert any(label.startswith("log-prob head") for label in labels), sorted(labels)
    assert all(seconds >= 0 for seconds in breakdown.seconds.values())
    assert 0 < breakdown.attributed_seconds
    assert 0 < breakdown.coverage <= 1.5  # instructions may overlap a little on several threads
    assert sum(breakdown.shares().values()) == pytest.approx(1.0)
    table = profiling.markdown(breakdown)
    assert "| MLP (gate, up, down) |" in table and "all attributed instructions" in table


def test_the_sampling_draw_is_labelled():
    logits = jax.random.normal(jax.random.key(1), (4, 97))
    keys = jax.random.split(jax.random.key(2), 4)
    params = sampler.SamplingParams(temperature=0.7, top_p=0.9)
    compiled = jax.jit(lambda k, x: sampler.sample_tokens(k, x, params)).lower(keys, logits).compile()
    breakdown = profiling.time_by_scope(compiled, (keys, logits), calls=1)
    assert "sampling (temperature, truncation, draw)" in breakdown.seconds
