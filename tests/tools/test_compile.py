"""Ahead-of-time compilation for TPU topologies (libtpu, no TPU): the quickstart's and Qwen3-0.6B's sampling
and training programs fit a v5e-8 (Qwen3-0.6B's a 16-chip, 4-host v5p slice too), shard their state as the
mesh says, and move nothing through the host (the decode loop included); whole-program FLOPs count every loop
iteration; bfloat16 optimizer state halves the moments; bad input gets one-line errors."""

import json
import math
import re
import sys

import jax
import pytest
from flax import nnx

from jaxgrpo import train
from jaxgrpo.config import apply_overrides, load_experiment
from jaxgrpo.distributed import round_up
from jaxgrpo.tools import cli
from jaxgrpo.tools import compile as aot

TOY = "experiments/toy_sum.py"
QUICKSTART = "experiments/quickstart.py"
QWEN = "experiments/qwen3_0_6b_grpo.py"
ONE_HOST, POD = "v5e:2x4", "v5p:2x2x4"  # 8 chips on 2 hosts; 16 chips on 4 hosts

# Each experiment at small CI shapes (a short prompt and completion, two micro-batches a minimibatch), laid
# out as FSDP over the one-host slice's 8 chips, and Qwen3-0.6B as 4-way data x 4-way FSDP over the pod's 16 (the
# quickstart on the pod compiled the same multi-host data x FSDP layout again: one pod case suffices).
CASES = {
    (QUICKSTART, ONE_HOST): ("mesh.data=1", "mesh.fsdp=-1", "sampling.max_prompt_len=64", "micro_batch_size=16"),
    (QWEN, ONE_HOST): ("prompts_per_step=4", "group_size=4", "num_minibatches=1", "micro_batch_size=8",
                       "sampling.max_prompt_len=64", "sampling.max_new_tokens=64"),
    (QWEN, POD): ("mesh.data=4", "mesh.fsdp=4", "prompts_per_step=8", "group_size=4", "num_minibatches=1",
                  "micro_batch_size=16", "sampling.max_prompt_len=64", "sampling.max_new_tokens=64"),
}
CHIPS = {ONE_HOST: (8, 2, 16 * aot.GiB), POD: (16, 4, 95 * aot.GiB)}  # chips, hosts, HBM per chip


# Every program compiles as `jaxgrpo-compile` compiles it for a user.
pytestmark = pytest.mark.usefixtures("users_matmul_precision")


def _config(path, *overrides):
    cfg = load_experiment(path)
    apply_overrides(cfg, list(overrides))
    return cfg


def _toy(*overrides):
    return _config(TOY, *overrides)


def _mesh(cfg, topology):
    return train.make_mesh(cfg, aot.topology_devices(topology)[1])


@pytest.fixture(scope="module")
def reports():
    """Compiled reports shared by the tests of this module, each compiled once when first asked for: the
    quickstart on the one-host slice with every program, Qwen3-0.6B with the update on it and with the rollout
    engine's programs and the update on the pod."""
    cache = {}

    def get(path, topology):
        if (path, topology) not in cache:
            programs = {(QUICKSTART, ONE_HOST): aot.RUN_PROGRAMS, (QWEN, ONE_HOST): ("update",)}.get(
                (path, topology), ("engine", "update"))
            cfg = _config(path, *CASES[path, topology])
            cache[path, topology] = (cfg, aot.compile_experiment(cfg, topology, programs=programs))
        return cache[path, topology]

    return get


@pytest.mark.parametrize("recipe, lookup, trained", [
    ("qwen3_1_7b_gsm8k_v5e_8.py", 0, True),  # tied: the embedding is the unembedding's product
    ("qwen3_8b_gsm8k_v5p_8.py", 151936 * 4096, True), ("qwen3_8b_lora_gsm8k_v5e_8.py", 151936 * 4096, False)])
def test_model_flops_count_no_untied_input_embedding(recipe, lookup, trained):
    """The N of 2·N and 6·N is the parameters a token multiplies by: an untied input embedding is a lookup. Counting
    it had put Qwen3-14B's estimated prefill MFU at 102%."""
    cfg = load_experiment(f"experiments/tpu/{recipe}")
    abstract = aot.abstract_train_state(cfg, _mesh(cfg, ONE_HOST))
    assert abstract.num_lookup == lookup and abstract.matmul_params == abstract.num_params - lookup
    assert abstract.matmul_trained == abstract.num_trained - (lookup if trained else 0)
    if cfg.lora:  # the adapters train; the base's products are frozen
        assert abstract.matmul_trained < abstract.matmul_params
    else:
        assert abstract.num_trained == abstract.num_params


# The pod case (4 hosts, data x FSDP on v5p's 3-D torus) is in the slow tier (`-m slow`); in CI the v5e:2x4 cases
# compile the experiments for a 2-host slice.
@pytest.mark.parametrize("path, topology", [
    pytest.param(p, t, id=f"{p.split('/')[-1][:-3]}-{t}", marks=[pytest.mark.slow] if t == POD else [])
    for p, t in CASES])
def test_experiment_fits_shards_its_state_and_decodes_without_the_host(reports, path, topology):
    cfg, report = reports(path, topology)
    chips, hosts, hbm = CHIPS[topology]
    assert report.chips == chips and report.hosts == hosts
    assert report.mesh == {"data": cfg.mesh.data if cfg.mesh.data > 0 else 1, "fsdp": chips // max(cfg.mesh.data, 1),
                           "model": 1}
    for program in report.programs:
        assert program.fits and 0 < program.hbm_bytes < program.hbm_capacity == hbm, program
        assert program.host_transfers == [], (program.program, program.host_transfers)
    # Parameters and optimizer state split over the data and FSDP axes (the partitioning rules shard them over
    # both, ZeRO-3 style): a chip holds 1/(data x fsdp) of them (only norm scales and scalars may be
    # replicated), and the compiled update takes that much of them as arguments, plus the padding of TPU
    # layouts (a shard's minor dimensions are padded to (8, 128) tiles: SmolLM2's over 16 chips, ~21%).
    mesh = train.make_mesh(cfg, aot.topology_devices(topology)[1])
    state = aot.abstract_train_state(cfg, mesh).state
    whole = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(state))
    per_chip = aot.per_chip_bytes(state)
    shards = report.mesh["data"] * report.mesh["fsdp"]
    assert shards == chips and whole / shards <= per_chip <= whole / shards * 1.02
    update = next(p for p in report.programs if p.program == "update")
    assert per_chip <= update.argument_bytes <= per_chip * 1.25
    assert update.alias_bytes >= per_chip * 0.99  # the state is donated: updated in place
    for decode in (p for p in report.programs if p.program.startswith("engine decode")):
        assert decode.step_floor_seconds > 0 and decode.loops_counted_once >= 1 and decode.mfu is None


def test_quickstart_programs_and_their_collectives_on_one_host(reports):
    cfg, report = reports(QUICKSTART, ONE_HOST)
    assert report.chip == "TPU v5e" and [p.program for p in report.programs] == [
        "engine prefill", "engine decode 50% full", "engine decode 100% full", "forward", "update"]
    prefill, *_, update = report.programs
    for program in report.programs:
        assert program.flops > 0 and program.bytes_accessed > 0
        assert program.compiler_seconds is None or program.compiler_seconds > 0
        assert program.model_flops_seconds == pytest.approx(program.model_flops / aot.CHIPS["v5e"].peak_flops)
    assert prefill.step_floor_seconds is None
    # A prefill computes logits only at the rows it draws from (a slot per sample): 2·N per prompt token less the
    # unembedding's 2·V·E elsewhere, so its estimated MFU stays a bound below 100%.
    c = aot.decoder_config(cfg)
    unembedding = c.vocab_size * c.hidden_size
    prompt_tokens = round_up(cfg.prompts_per_step, 8) * cfg.sampling.max_prompt_len
    draws = round_up(cfg.prompts_per_step * cfg.group_size, 8)
    assert prefill.model_flops == pytest.approx(
        (2 * (report.num_params - unembedding) * prompt_tokens + 2 * unembedding * draws) / 8)
    assert 0 < prefill.mfu <= 1 and prefill.model_flops <= prefill.program_flops
    # FSDP: the update gathers parameters for the forward and reduces gradients.
    assert update.collectives["all-gather"]["count"] > 0
    assert update.collectives["all-reduce"]["count"] + update.collectives["reduce-scatter"]["count"] > 0
    # 6·N per trained token, split over the chips: one minibatch of prompt + completion slots.
    tokens = cfg.batch_size // cfg.num_minibatches * (cfg.sampling.max_prompt_len + cfg.sampling.max_new_tokens)
    assert update.model_flops == pytest.approx(6 * report.num_params * tokens / 8)


def test_program_flops_count_every_layer_and_micro_batch(reports):
    """The compiler counts the layer scan's and the micro-batch scan's bodies once; the traced program's
    products, with loops times their trip counts, come to at least 6 FLOPs per non-embedding parameter
    per trained token (forward 2, backward 4; remat's recomputed forward and attention come on top).
    Splash attention's calls (the TPU default) count apart, golden by hand: each micro-batch's 2 packed
    groups of 64 + 4 x 64 = 320 slots, padded to 384 (3 blocks of 128, causal: 6 visited) and to one row
    per chip (8 rows: the padded rows run too), 2 calls per row (own branch and trunk), 28 layers x 16
    heads, 11 products of 2·128³ per visited block (forward 2, remat's recomputed forward 2, backward 3 + 4)."""
    from jaxgrpo import models

    cfg, report = reports(QWEN, ONE_HOST)
    update = next(p for p in report.programs if p.program == "update")
    config = models.load_config(cfg.model)
    embedding = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    tokens_per_chip = cfg.batch_size * (cfg.sampling.max_prompt_len + cfg.sampling.max_new_tokens) / 8
    dense = 6 * (report.num_params - embedding) * tokens_per_chip
    assert report.attention == "pallas_tpu" and update.pallas_calls_without_estimate == 0
    assert update.pallas_flops == 2 * 8 * 2 * 28 * 16 * 6 * 11 * 2 * 128 ** 3 / 8
    assert dense <= update.program_flops - update.pallas_flops <= 8 * report.num_params * tokens_per_chip
    assert 0 < update.pallas_seconds < update.estimated_seconds
    assert update.program_flops > 10 * update.flops  # 28 layers x 2 micro-batches, counted once by the compiler
    assert update.mfu == pytest.approx(update.model_flops_seconds / update.estimated_seconds)
    assert 0.05 < update.mfu < 1.0


def test_count_products_multiplies_loop_bodies_by_their_trip_counts():
    """Golden values: a scan of 3 [4, 8] x [8, 16] products inside a 2-step scan is 2·3·(2·4·8·16) FLOPs; a
    `while` of run-time length counts once and is reported."""
    import jax.numpy as jnp

    def scanned(x, w):
        def outer(c, _):
            return jax.lax.scan(lambda c2, wl: (c2, c2 @ wl), c, w)[0], None
        return jax.lax.scan(outer, x, None, length=2)[0]

    jaxpr = jax.make_jaxpr(scanned)(jnp.ones((4, 8)), jnp.ones((3, 8, 16)))
    count = aot.count_products(jaxpr, peak_flops=1e12, hbm_bandwidth=1e9)
    assert count.flops == 2 * 3 * 2 * 4 * 8 * 16 and count.loops_counted_once == 0
    assert count.pallas_flops == count.pallas_seconds == count.pallas_calls_without_estimate == 0
    assert count.bytes == 2 * 3 * (4 * 8 + 8 * 16 + 4 * 16) * 4
    assert count.roofline_seconds == pytest.approx(count.bytes / 1e9)  # this small product is bandwidth-bound

    def looped(x, n):
        return jax.lax.while_loop(lambda c: c[1] < n, lambda c: (c[0] @ jnp.eye(8), c[1] + 1), (x, 0))[0]

    count = aot.count_products(jax.make_jaxpr(looped)(jnp.ones((4, 8)), 5), 1e12, 1e9)
    assert count.flops == 2 * 4 * 8 * 8 and count.loops_counted_once == 1


def test_count_products_counts_splash_attention_over_the_blocks_its_causal_mask_visits():
    """Golden values: one row of 384 slots is 3 blocks of 128, of which a causal mask visits 6 of 9 (query
    block i sees key blocks 0..i); each visit of each of the 4 query heads is 2·128·128·128 FLOPs per
    product: 2 products forward, and 3 (dq) + 4 (dkv) more in the backward. Tracing only: nothing runs."""
    import jax.numpy as jnp

    from jaxgrpo.models.attention import pallas_tpu

    rows, length, kv_heads, groups, head_dim, block = 2, 384, 2, 2, 128, 128
    q = jnp.ones((rows, length, kv_heads, groups, head_dim), jnp.bfloat16)
    k = jnp.ones((rows, length, kv_heads, head_dim), jnp.bfloat16)
    ids = jnp.ones((rows, length), jnp.int32)

    def attention(q, k, v):
        out = pallas_tpu.attend(q, k, v, {"query": ids, "key": ids}, False, scale=0.1)
        return out.astype(jnp.float32).sum()

    per_product = rows * kv_heads * groups * 6 * 2 * block * block * head_dim
    forward = aot.count_products(jax.make_jaxpr(attention)(q, k, k), 1e12, 1e9)
    assert forward.pallas_flops == forward.flops == 2 * per_product
    assert forward.pallas_calls_without_estimate == 0
    # With bandwidth to spare, each call takes its FLOPs at the peak.
    trained = aot.count_products(jax.make_jaxpr(jax.grad(attention, argnums=(0, 1, 2)))(q, k, k), 1e12, 1e30)
    assert trained.pallas_flops == (2 + 3 + 4) * per_product
    assert trained.pallas_seconds == pytest.approx(trained.pallas_flops / 1e12)


def test_count_products_counts_the_decode_kernel_at_a_full_cache_per_shard_times_shards():
    """Golden values: a [2 layers, 2 rows, 2 kv heads, 256 slots, 128] cache read by 4 rows of 2 query heads
    per kv head (each cache row shared by 2 rows: 4 stacked queries) is 2 products of 2·4·256·128 FLOPs per
    row and kv head, whatever the live length; its bytes hold both caches' 256 slots of the layer. Split
    over 2 devices by `shard_map`, the per-shard count times the shards gives the same whole."""
    import jax.numpy as jnp

    from jaxgrpo.models.attention import pallas_decode

    layers, rows, kv_heads, capacity, head_dim, groups = 2, 2, 2, 256, 128, 2
    cache = jnp.ones((layers, rows, kv_heads, capacity, head_dim), jnp.bfloat16)
    q = jnp.ones((2 * rows, 1, kv_heads, groups, head_dim), jnp.bfloat16)
    flops = rows * kv_heads * 2 * (2 * 4 * capacity * head_dim)
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:2])
    for on in (None, mesh):
        def state(q, k, v):
            return pallas_decode.cache_attention_state(q, k, v, 1, 37, 0.1, mesh=on, interpret=True)

        count = aot.count_products(jax.make_jaxpr(state)(q, cache, cache), 1e12, 1e9)
        assert count.pallas_flops == count.flops == flops, on
        assert count.bytes >= 2 * rows * kv_heads * capacity * head_dim * 2


def test_the_engines_kv_memory_follows_its_live_tokens_and_each_host_compiles_its_own():
    # The toy on a 2-host slice (the learner 4-way data x 2-way FSDP): a run's engines are one per host, on its 4
    # chips with its half of the rows and its copy of the weights split over them (`train.process_sampler_mesh`),
    # so host 0's is compiled: its pool and slots over its 4 chips, at two fill levels.
    cfg = _toy("mesh.data=4", "mesh.fsdp=2")
    report = aot.compile_experiment(cfg, ONE_HOST, programs=("engine",))
    c = aot.decoder_config(cfg)
    chips, hosts = 4, 2
    position_bytes = 2 * c.num_layers * c.num_kv_heads * c.head_dim * jax.numpy.dtype(cfg.dtype).itemsize / chips
    _, half, full = report.programs
    assert [p.program for p in report.programs] == ["engine prefill", "engine decode 50% full",
                                                    "engine decode 100% full"]
    assert all(p.fits and not p.host_transfers for p in report.programs)
    prefill = report.programs[0]
    prompts, samples = cfg.prompts_per_step // hosts, cfg.prompts_per_step * cfg.group_size // hosts
    matmul_params = report.num_params - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)  # N: no lookup
    assert prefill.model_flops == pytest.approx(aot.prefill_model_flops(
        matmul_params, c.vocab_size * c.hidden_size, round_up(prompts, chips) * cfg.sampling.max_prompt_len,
        round_up(samples, chips)) / chips)
    assert 0 < prefill.mfu <= 1 and prefill.model_flops <= prefill.program_flops
    # The pool holds the host's live positions in whole blocks, plus each chip's null block, and a chip a quarter;
    # the step's floor reads a quarter of the weights per chip (the host's copy split over its 4 chips).
    assert full.live_tokens > 1.8 * half.live_tokens
    context = cfg.sampling.max_prompt_len + cfg.sampling.max_new_tokens
    assert full.live_tokens == samples * round_up(context, aot.ENGINE_BLOCK_SIZE)
    weights = sum(math.prod(x.shape) * x.dtype.itemsize for x in
                  jax.tree.leaves(aot.abstract_train_state(cfg, _mesh(cfg, ONE_HOST)).state.params))
    chip = aot.CHIPS["v5e"]
    for p in (half, full):  # keys and values of every layer, over 4 row shards, each with its null block
        assert p.kv_pool_bytes == (p.live_tokens + chips * aot.ENGINE_BLOCK_SIZE) * position_bytes
        assert p.step_floor_seconds * chip.hbm_bandwidth == pytest.approx(weights / chips + p.kv_pool_bytes, rel=0.01)
    # The decode chunk's arguments grow by its donated pool's growth, nothing else changes between the levels (the
    # chip allocates the toy's small buffers in rounded-up sizes, so the donated bytes are the measure), and no
    # collective moves more for the bigger pool: each shard reads its own blocks.
    assert all(p.alias_bytes >= p.kv_pool_bytes for p in (half, full))
    assert full.argument_bytes - half.argument_bytes == full.alias_bytes - half.alias_bytes > 0
    assert full.collectives == half.collectives
    # The paged kernel's cost counts at most the pool's positions (`paged_cost_estimate`), so a half-full pool's
    # decode is estimated at about half the full one's Pallas time.
    assert 0 < half.pallas_seconds < 0.6 * full.pallas_seconds
    # On a TPU the decode reads the blocks in place with pallas_tpu's paged kernel (no dense view of them).
    mesh = _mesh(cfg, ONE_HOST)
    decode = aot.lower_engine(cfg, mesh, aot.abstract_train_state(cfg, mesh), 0.5).decode[0]
    assert "paged_attention_state" in decode.as_text()


def test_bfloat16_optimizer_state_halves_the_moments_a_chip_holds():
    f32 = _toy("mesh.data=1", "mesh.fsdp=-1")
    bf16 = _toy("mesh.data=1", "mesh.fsdp=-1", "optimizer.state_dtype=bfloat16")
    _, devices = aot.topology_devices(ONE_HOST)
    states = [aot.abstract_train_state(cfg, train.make_mesh(cfg, devices)).state for cfg in (f32, bf16)]
    params = aot.per_chip_bytes(states[0].params)
    moments = [aot.per_chip_bytes(s.opt_state) for s in states]
    assert moments[1] == pytest.approx(moments[0] / 2, rel=0.01) and moments[0] == pytest.approx(2 * params, rel=0.01)
    compiled = [aot.compile_experiment(cfg, ONE_HOST, programs=("update",)).programs[0] for cfg in (f32, bf16)]
    assert compiled[1].fits and compiled[1].host_transfers == []
    # The update's arguments (state and batch) shrink by at least the moments' half: more for the toy's tiny
    # arrays, whose TPU layouts pad each shard to whole (8, 128) tiles.
    assert compiled[0].argument_bytes - compiled[1].argument_bytes >= moments[0] / 2


def test_fsdp_and_tensor_parallelism_split_the_state_over_the_chips():
    cfg = _toy("mesh.data=1", "mesh.fsdp=-1")
    _, devices = aot.topology_devices(ONE_HOST)
    abstract = aot.abstract_train_state(cfg, train.make_mesh(cfg, devices))
    whole = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(abstract.state))
    # Tensor parallelism over 2 chips and FSDP over 4 split it 8 ways too.
    cfg = _toy("mesh.data=1", "mesh.fsdp=4", "mesh.model=2")
    split = aot.per_chip_bytes(aot.abstract_train_state(cfg, train.make_mesh(cfg, devices)).state)
    assert whole / 8 <= split <= whole / 8 * 1.05


def test_report_counts_collectives_and_host_transfers_in_hlo_text():
    text = """
  %ag = bf16[8,128]{1,0} all-gather(bf16[1,128]{1,0} %p), dimensions={0}
  %ars = (f32[4]{0}, f32[2,2]{1,0}) all-reduce-start(f32[4]{0} %a, f32[2,2]{1,0} %b), to_apply=%sum
  %ard = (f32[4]{0}, f32[2,2]{1,0}) all-reduce-done((f32[4]{0}, f32[2,2]{1,0}) %ars)
  %in = (s32[2]{0}, token[]) infeed(token[] %t)
  %cc = f32[] custom-call(), custom_call_target="xla_python_cpu_callback"
"""
    found = aot.collectives(text)
    assert found["all-gather"] == {"count": 1, "bytes": 8 * 128 * 2}
    assert found["all-reduce"] == {"count": 1, "bytes": (4 + 4) * 4}
    assert found["all-to-all"] == {"count": 0, "bytes": 0}
    assert aot.host_transfers(text) == ["infeed", "xla_python_cpu_callback"]


def test_cli_writes_the_report_and_exits_by_whether_it_fits(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = cli.compile_main([TOY, "--topology", "v5e:2x4", "--programs", "forward", "--json", str(out)])
    assert code == 0
    assert "forward  fits" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["topology"] == "v5e:2x4" and saved["programs"][0]["program"] == "forward"


@pytest.mark.parametrize("args, message", [
    (["--topology", "v9z:2x2"], "unknown TPU topology 'v9z:2x2': write GENERATION:SHAPE"),
    (["--topology", "v5e"], "unknown TPU topology 'v5e'"),
    (["--topology", "v5e:3x7"], "libtpu cannot lay out the topology 'v5e:3x7'"),
    (["--topology", "v5e:2x4", "--set", "mesh.data=1", "mesh.fsdp=3"], "does not divide the 8 devices"),
    (["--topology", "v5e:2x4", "--set", "model=no-such-model"], "'no-such-model' is neither a model directory"),
    (["--topology", "v5e:2x4", "--programs", "sampler"], "unknown program(s) sampler; valid: engine, forward, update"),
    (["--topology", "v5e:2x4", "--programs", "decode"], "sampler.generate's fixed batch, removed when the rollout engine"),
])
def test_bad_input_gets_one_line_errors(args, message, capsys):
    assert cli.compile_main([TOY, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxgrpo-compile: error: ") and message in err and "\n" not in err, err


def test_missing_libtpu_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` now raises ImportError
    with pytest.raises(RuntimeError, match=r'pip install "jax\[tpu\]==0.10.2"'):
        aot.topology_devices("v5e:2x4")


def test_cpu_kernels_are_never_chosen_for_a_tpu_program():
    """A CPU process compiling for a TPU: the mesh's devices, not the default backend, pick the decoder's kernels."""
    from jaxgrpo.models import cpu_attention, cpu_kernels, cpu_matmul

    _, devices = aot.topology_devices("v5e:2x2")
    tpu = jax.sharding.Mesh(devices[:1], ("data",))
    cpu = jax.sharding.Mesh(jax.devices("cpu")[:1], ("data",))
    assert not cpu_kernels.targets_cpu(tpu) and not cpu_kernels.targets_cpu(tpu.abstract_mesh)
    assert cpu_kernels.targets_cpu(cpu) and cpu_kernels.targets_cpu(cpu.abstract_mesh)
    assert not cpu_matmul.use_for(jax.numpy.bfloat16, tpu.abstract_mesh)
    assert not cpu_attention.use_for(jax.numpy.bfloat16, 64, 1, tpu.abstract_mesh)
    assert cpu_matmul.use_for(jax.numpy.bfloat16, cpu.abstract_mesh) == cpu_matmul.available()


def test_splash_attention_compiles_for_a_tpu_and_is_its_default():
    """The toy's update (packed prompt groups: splash's two-call merge with its backward) compiled for a v5e-8
    with libtpu's real Pallas kernels: the program calls them (`tpu_custom_call`), and only with attention
    pallas_tpu, which "auto" picks for a TPU; the CPU implementation is refused there before anything compiles."""
    _, devices = aot.topology_devices(ONE_HOST)
    texts = {}
    for name in ("pallas_tpu", "xla"):
        cfg = _toy("mesh.data=1", "mesh.fsdp=-1", f"attention={name}")
        mesh = train.make_mesh(cfg, devices)
        lowered, _, _ = aot.lower_update(cfg, mesh, aot.abstract_train_state(cfg, mesh))
        texts[name] = lowered.compile().as_text()
    assert "tpu_custom_call" in texts["pallas_tpu"] and "tpu_custom_call" not in texts["xla"]
    assert aot.host_transfers(texts["pallas_tpu"]) == []
    # "auto" resolves by the platform of the mesh the program is laid out on.
    tiny = nnx.eval_shape(lambda: train.MODEL_BUILDERS["toy-tiny"](dtype=jax.numpy.float32, remat=True)[0])
    assert tiny.attention == "auto" and tiny.attention_implementation(mesh.abstract_mesh).name == "pallas_tpu"
    cfg = _toy("mesh.data=1", "mesh.fsdp=-1", "attention=cpu")
    with pytest.raises(ValueError, match="'cpu' does not run on tpu; available there: auto, xla, pallas_tpu"):
        aot.lower_update(cfg, mesh, aot.abstract_train_state(cfg, mesh))


def test_the_cpu_memory_forms_are_in_cpu_programs_only():
    """The decoder's XLA:CPU forms (bfloat16 read as its bits behind optimization barriers:
    `jaxgrpo.models.cpu_forms`) are traced for a program laid out on CPUs and left out of the same program for
    a TPU (`v5e:2x4`), unless forced: the toy's bfloat16 update and a decode step with a run-time cache index
    and a shared prefix (the XLA cache reads, attention="xla"; pallas_tpu reads the cache through its kernel).
    The update also holds barriers of its own (`jax.checkpoint`'s, around recomputed log-prob chunks) and
    other bitcasts (the float tricks of `kernels/segments.py`): there the CPU forms are the bfloat16 bits and
    the barriers they add."""
    from jaxgrpo.models import backend

    _, tpu_devices = aot.topology_devices(ONE_HOST)

    def programs(devices, attention):
        cfg = _toy("dtype=bfloat16", "mesh.data=1", "mesh.fsdp=-1", f"attention={attention}")
        mesh = train.make_mesh(cfg, devices)
        abstract = aot.abstract_train_state(cfg, mesh)
        update = aot.lower_update(cfg, mesh, abstract)[0].as_text()
        graphdef, state = nnx.split(nnx.merge(abstract.graphdef, abstract.state.params, abstract.rest).decoder)
        rows, capacity = 8, 32
        cache = jax.eval_shape(lambda: nnx.merge(graphdef, state).init_cache(rows, capacity))
        prefix = jax.eval_shape(lambda: nnx.merge(graphdef, state).init_cache(rows // 2, 16))

        def step(state, tokens, cache, index, kv_mask, prefix, prefix_mask):
            return nnx.merge(graphdef, state)(tokens, cache=cache, cache_index=index, kv_mask=kv_mask, prefix=prefix,
                                              prefix_mask=prefix_mask)

        shape = jax.ShapeDtypeStruct
        with jax.set_mesh(mesh):
            decode = jax.jit(step).lower(state, shape((rows, 1), jax.numpy.int32), cache, shape((), jax.numpy.int32),
                                         shape((rows, capacity), bool), prefix, shape((rows // 2, 16), bool)).as_text()
        return {"update": update, "decode step": decode}

    def bits_and_barriers(text):
        bits = len(re.findall(r"bitcast_convert [^\n]*(?:bf16[^\n]*ui16|ui16[^\n]*bf16)", text))
        return bits, text.count("stablehlo.optimization_barrier")

    cpu = programs(jax.devices("cpu")[:1], "xla")
    with backend.force_cpu_forms(True):
        forced = programs(tpu_devices, "xla")
    for attention in ("xla", "pallas_tpu"):
        tpu = programs(tpu_devices, attention)
        assert bits_and_barriers(tpu["decode step"]) == (0, 0), attention
        bits, barriers = bits_and_barriers(tpu["update"])
        assert bits == 0 and barriers < bits_and_barriers(forced["update"])[1], attention
    for name in cpu:
        assert min(bits_and_barriers(cpu[name])) > 0 and min(bits_and_barriers(forced[name])) > 0, name


def test_a_split_mesh_compiles_the_sampler_on_its_chips_and_reports_the_weights_it_receives():
    """One-step-off on a 16-chip v5p with 8 chips sampling (`mesh.rollout_devices=8`) and 8 learning: the decode
    loop is compiled for the sampler's data-parallel mesh, the update for the learner's, each reporting its HBM
    per chip, and the report gives the bytes of weights moved to the sampler after each update."""
    cfg = _toy("max_staleness=1", "mesh.rollout_devices=8", "mesh.data=2", "mesh.fsdp=4")
    report = aot.compile_experiment(cfg, POD, programs=("engine", "update"))
    assert report.mesh == {"data": 2, "fsdp": 4, "model": 1} and report.chips == 16
    assert report.rollout["chips"] == 8 and report.rollout["mesh"] == {"data": 8, "fsdp": 1, "model": 1}
    assert report.rollout["programs"] == ["engine"]
    params = aot.abstract_train_state(cfg, train.make_mesh(cfg, jax.devices()[:8])).state.params
    assert report.rollout["weight_transfer_bytes"] == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    *engine, update = report.programs
    assert [p.program for p in engine] == ["engine prefill", "engine decode 50% full", "engine decode 100% full"]
    assert all(p.fits and p.hbm_bytes > 0 for p in report.programs)
    assert "the sampler on 8 (mesh {'data': 8, 'fsdp': 1, 'model': 1}: engine)" in report.table()
    with pytest.raises(ValueError, match="mesh.rollout_devices=16 leaves the learner none of v5p:2x2x4's 16 chips"):
        aot.compile_experiment(_toy("max_staleness=1", "mesh.rollout_devices=16"), POD, programs=("update",))
