"""A peer compiled the way `jaxgrpo-compile` compiles: tunix's GRPO training step for the same model,
shapes and TPU topology, ahead of time with libtpu on a CPU-only machine, for docs/tpu.md's ratios.

tunix is not a jaxgrpo dependency. Install it and the modules its imports need into a throwaway
location, without touching this environment's packages:

    pip download --no-deps google-tunix==0.1.7 -d /tmp/tunix_dl
    python -m zipfile -e /tmp/tunix_dl/google_tunix-0.1.7-py3-none-any.whl /tmp/tunix_x
    pip install --no-deps --target /tmp/tunix_deps google-metrax qwix jaxtyping wadler_lindig clu \
        omegaconf antlr4-python3-runtime kagglehub sentencepiece perfetto
    PYTHONPATH=/tmp/tunix_x:/tmp/tunix_deps JAX_PLATFORMS=cpu \
        python benchmarks/peer_tunix_compile.py --model qwen3_4b --topology v5e:2x4 --json /tmp/tunix_4b.json

What is compiled: one micro-batch's training step as tunix's trainer jits it (its Qwen3 with remat of
each decoder layer, bfloat16 weights, FSDP over every chip as its default sharding says; the loss is
`algo_core.grpo_loss_fn` over prompts and completions; AdamW with the gradient applied at once). tunix
accumulates micro-batches outside its jitted step, so the comparison with jaxgrpo's update, which
scans its micro-batches inside one program, is per micro-batch: jaxgrpo's figures divided by its
micro-batches per update.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxgrpo.tools import compile as aot  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_4b", help="a tunix ModelConfig constructor, e.g. qwen3_4b")
    parser.add_argument("--topology", default="v5e:2x4")
    parser.add_argument("--rows", type=int, default=16, help="sequences per micro-batch")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--completion-len", type=int, default=1024)
    parser.add_argument("--json", help="write the report as JSON here")
    args = parser.parse_args(argv)
    try:
        from tunix.models.qwen3 import model as qwen3
        from tunix.rl import algo_core, common
        from tunix.rl.grpo.grpo_learner import GRPOConfig
    except ImportError as error:
        print(f"peer_tunix_compile: cannot import tunix ({error}); see this file's docstring", file=sys.stderr)
        return 2

    chip, devices = aot.topology_devices(args.topology)
    mesh = jax.sharding.Mesh(np.array(devices).reshape(len(devices), 1), ("fsdp", "tp"))
    config = getattr(qwen3.ModelConfig, args.model)()
    config = dataclasses.replace(config, remat_config=qwen3.RematConfig.DECODER, dtype=jnp.bfloat16,
                                 param_dtype=jnp.bfloat16)
    with jax.set_mesh(mesh):
        abstract = nnx.eval_shape(lambda: qwen3.Qwen3(config, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract, nnx.Param)
    specs = nnx.get_partition_spec(params)
    params = jax.tree.map(lambda x, spec: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec)),
                          params, specs)
    optimizer = optax.adamw(1e-6, b1=0.9, b2=0.99)
    opt_state = optax.tree_map_params(
        optimizer, lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p.sharding),
        jax.eval_shape(optimizer.init, params), params,
        transform_non_params=lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, P())))
    algo = GRPOConfig(num_generations=8, beta=0.04, epsilon=0.2)
    # tunix 0.1.7's grpo_loss_fn reads `algo_config.temperature`, which its GRPOConfig does not declare (its
    # learner sets it from the rollout config); sampling temperature 1.0 as jaxgrpo's recipes use.
    object.__setattr__(algo, "temperature", 1.0)
    rows = NamedSharding(mesh, P("fsdp"))

    def batch(length, dtype):
        return jax.ShapeDtypeStruct((args.rows, length), dtype, sharding=rows)

    example = common.TrainExample(
        prompt_ids=batch(args.prompt_len, jnp.int32), prompt_mask=batch(args.prompt_len, jnp.bool_),
        completion_ids=batch(args.completion_len, jnp.int32), completion_mask=batch(args.completion_len, jnp.bool_),
        advantages=jax.ShapeDtypeStruct((args.rows,), jnp.float32, sharding=rows),
        ref_per_token_logps=batch(args.completion_len, jnp.float32),
        old_per_token_logps=batch(args.completion_len, jnp.float32))

    def step(params, opt_state, example):
        def loss(params):
            return algo_core.grpo_loss_fn(nnx.merge(graphdef, params), example, algo, pad_id=0, eos_id=1)[0]

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    with jax.set_mesh(mesh):
        traced = jax.jit(step, donate_argnums=(0, 1)).trace(params, opt_state, example)
        compiled, seconds = aot.compile_lowered(traced.lower())
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    tokens = args.rows * (args.prompt_len + args.completion_len)
    report = aot.program_report("update", compiled, seconds, traced.jaxpr, chip, len(devices), 6 * num_params * tokens)
    out = {"peer": "google-tunix 0.1.7", "model": args.model, "topology": args.topology, "rows": args.rows,
           "num_params": num_params, "program": dataclasses.asdict(report)}
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
