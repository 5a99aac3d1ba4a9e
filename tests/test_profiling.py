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


def _write_trace(directory, events):
    """A trace.json.gz of `events` where jax.profiler puts one (plugins/profile/<run>/)."""
    import gzip
    import json

    run = directory / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    with gzip.open(run / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    return str(directory)


def _meta(pid, name):
    return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}


def _kernel(pid, tid, ts, dur, name="k", hlo_op=None):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name,
            "args": {"hlo_op": hlo_op} if hlo_op else {}}


def test_device_busy_seconds_is_the_union_of_a_devices_kernels(tmp_path):
    """Overlapping kernels on two streams of one GPU count once; the host's events and a CPU-only trace do not."""
    gpu = _write_trace(tmp_path / "gpu", [_meta(1, "/device:GPU:0"), _meta(2, "/host:CPU"), _kernel(1, 1, 0, 10),
                                          _kernel(1, 2, 5, 10), _kernel(1, 1, 30, 5), _kernel(2, 1, 0, 1000)])
    assert profiling.device_busy_seconds(gpu) == pytest.approx(20e-6)  # [0, 15) and [30, 35)
    cpu = _write_trace(tmp_path / "cpu", [_meta(1, "/device:CUSTOM:Megascale Trace"), _meta(2, "/host:CPU"),
                                          _kernel(2, 1, 0, 1000)])
    assert profiling.device_busy_seconds(cpu) is None
    assert profiling.device_kernels(cpu) is None


def test_device_kernels_counts_launches_gaps_and_the_costliest_per_step(tmp_path):
    """Two steps of three launches on one GPU (two streams, one overlap), a host event beside them: per step,
    the launches and their time, the busy union, the idle gaps between kernels, the kernels by instruction."""
    events = [_meta(1, "/device:GPU:0"), _meta(2, "/host:CPU"), _kernel(2, 1, 0, 500, "host work")]
    for step in (0, 100):  # step 0 at 0 us, step 1 at 100 us
        events += [_kernel(1, 1, step + 0, 10, "gemm", "dot.1"), _kernel(1, 2, step + 5, 10, "fusion.3"),
                   _kernel(1, 1, step + 40, 20, "triton", "pallas_call.0")]
    summary = profiling.device_kernels(_write_trace(tmp_path / "t", events), count=2, top=2)
    assert summary["kernels_per_step"] == 3
    assert summary["kernel_ms_per_step"] == pytest.approx(40e-3)
    assert summary["busy_ms_per_step"] == pytest.approx(35e-3)  # [0, 15) and [40, 60)
    # gaps [15, 40), [60, 100), [115, 140): three over two steps
    assert summary["gaps_per_step"] == 1.5 and summary["median_gap_us"] == 25
    assert summary["gap_ms_per_step"] == pytest.approx((25 + 40 + 25) / 2 / 1e3)
    assert summary["top_kernels_ms_per_step"] == pytest.approx({"pallas_call.0": 20e-3, "dot.1": 10e-3})
    assert summary["top_kernels_launches_per_step"] == {"pallas_call.0": 1, "dot.1": 1}


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


def _message(*fields) -> bytes:
    """A serialized protobuf message of (field number, int | bytes | str) fields, written by hand."""
    def varint(n):
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out

    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += varint(number << 3) + varint(value)
        else:
            value = value.encode() if isinstance(value, str) else value
            out += varint(number << 3 | 2) + varint(len(value)) + value
    return out


def test_op_names_are_read_from_the_hlo_the_trace_stored():
    """An XSpace as the profiler writes it: a metadata plane whose event metadata carries each program's HLO."""
    instruction = lambda name, op_name: _message((1, name), (2, "fusion"), (7, _message((1, "mul"), (2, op_name))))  # noqa: E731
    module = _message((1, "jit_step"), (3, _message((1, "main"), (2, instruction("fusion.3", "jit(step)/mlp/mul")),
                                                    (2, instruction("dot.1", "jit(step)/attention/qkv/dot_general")),
                                                    (2, _message((1, "param.0"), (2, "parameter"))))))
    hlo_stat = _message((1, 7), (6, _message((1, module))))  # XStat: metadata id 7 ("Hlo Proto"), bytes
    event = _message((1, 42), (2, "jit_step"), (5, hlo_stat), (5, _message((1, 8), (4, 1))))  # and an int stat
    plane = _message((1, 1), (2, "/host:metadata"), (4, _message((1, 42), (2, event))),
                     (5, _message((1, 7), (2, _message((1, 7), (2, "Hlo Proto"))))),
                     (5, _message((1, 8), (2, _message((1, 8), (2, "program_id"))))))
    other_plane = _message((1, 2), (2, "/host:CPU"), (4, _message((1, 1), (2, _message((1, 1), (2, "x"))))))
    space = _message((1, plane), (1, other_plane), (2, b"\x00" * 300))  # a long field: a two-byte length varint
    assert profiling.xplane_op_names(space) == {
        "jit_step": {"fusion.3": "jit(step)/mlp/mul", "dot.1": "jit(step)/attention/qkv/dot_general"}}


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


def test_what_a_device_ran_is_read_from_its_streams_or_ops_not_the_lines_that_summarize_them(tmp_path):
    """A GPU's kernels are on its stream lines (an "XLA Ops" line beside them groups the same kernels); a TPU's on
    its "XLA Ops" line; a program's span ("XLA Modules") and a step's ("Steps") cover the gaps between them."""
    thread = lambda pid, tid, name: {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,  # noqa: E731
                                     "args": {"name": name}}
    events = [_meta(1, "/device:GPU:0"), thread(1, 1, "Stream #7(Compute)"), thread(1, 2, "XLA Ops"),
              thread(1, 3, "XLA Modules"), _meta(2, "/device:TPU:0"), thread(2, 1, "Steps"), thread(2, 2, "XLA Ops"),
              thread(2, 3, "XLA Modules")]
    for pid in (1, 2):  # on each: a program's span, two instructions in it
        events += [_kernel(pid, 3, 0, 100, "jit_step"), _kernel(pid, 2, 0, 10, "fusion"), _kernel(pid, 2, 50, 10, "dot")]
    events += [_kernel(1, 1, 0, 10, "fusion_kernel"), _kernel(1, 1, 50, 10, "gemm_kernel"),  # the GPU's kernels
               _kernel(2, 1, 0, 100, "step 1")]  # the TPU's step
    directory = _write_trace(tmp_path / "t", events)
    assert profiling.device_busy_seconds(directory) == pytest.approx(40e-6)  # 20 us on each device, not 100
    summary = profiling.device_kernels(directory)
    assert summary["kernels_per_step"] == 4 and summary["gaps_per_step"] == 2 and summary["median_gap_us"] == 40
    assert set(summary["top_kernels_ms_per_step"]) == {"fusion_kernel", "gemm_kernel", "fusion", "dot"}


def test_a_step_profile_says_how_busy_the_accelerator_was():
    """On an accelerator the step summary ends with the kernels a step launched and the gaps between them; on a
    CPU (no device summary) it does not."""
    profile = profiling.StepProfile(steps=(3, 4), wall_seconds=0.010, phases={"sample": 0.008},
                                    programs={"jit_decode": 0.004}, parts={"other": 0.004}, instructions={})
    assert "kernels a step" not in profiling.step_markdown(profile)
    profile.device = {"kernels_per_step": 450, "kernel_ms_per_step": 4.0, "busy_ms_per_step": 4.0,
                      "gaps_per_step": 449, "gap_ms_per_step": 6.0, "median_gap_us": 12.5}
    assert ("The accelerator ran 450 kernels a step (4.0 ms of kernel time), busy 4.0 ms of the step's 10.0 (40%); "
            "between kernels it waited 449 times, 6.0 ms in all (median gap 12.5 us).") in profiling.step_markdown(profile)
