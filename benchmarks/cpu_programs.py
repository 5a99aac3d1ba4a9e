"""SHA-256 of the CPU programs the decoder's memory forms shape, to check that a change leaves them as they were.

The XLA:CPU forms (bit-level reads behind barriers, custom-JVP slices, 32-slot cache chunks, packed
weights, the C++ decode kernel) are traced only for programs that run on CPUs. A refactoring of where
they live must not change those programs: this lowers each one (`jax.jit(...).lower(...)`, nothing
compiled or run, no weights read: parameters are abstract) and hashes its StableHLO text without debug
information (`as_text(debug_info=False)`: no source locations, so moving code between files does not
change a hash). The programs, for the toy model ("toy-tiny") and SmolLM2-135M's architecture, each in
float32 and bfloat16:

* the rollout engine's prefill and decode chunk (`jaxgrpo.engine.trace_programs`, the programs an `Engine` on
  one CPU device runs: no mesh, the decode through dense views of its blocks), with one slot per prompt and
  with four drawing from each prompt's prefill;
* one decoder decode step called directly (a run-time cache index), without and with a shared prefix;
* the trainer's log-prob forward and update step on a one-device CPU mesh (`jaxgrpo.tools.compile.lower_forward`
  and `lower_update`, which build them as the trainer does).

    python benchmarks/cpu_programs.py                   # this tree's hashes
    python benchmarks/cpu_programs.py --against main    # this tree against a revision: same / different

`--against REV` checks REV out in a detached git worktree (removed afterwards), runs this file there with
PYTHONPATH set to it, and prints one row per program. `--dump DIR` writes each program's text, to diff.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # CPU programs; with libtpu installed, jax would probe for a TPU

import jax
import jax.numpy as jnp
from flax import nnx

MODELS = {"toy": "toy-tiny", "smollm2": "smollm2-135m-instruct"}
DTYPES = ("float32", "bfloat16")
PROMPTS, PROMPT_BUCKET, NEW_BUCKET, BLOCK_SIZE = 2, 16, 16, 16  # the engine's default blocks


def _config(model: str, dtype: str):
    from jaxgrpo.config import Config

    cfg = Config()
    cfg.model, cfg.dtype = model, dtype
    cfg.prompts_per_step, cfg.group_size = 2, 2
    cfg.sampling.max_prompt_len, cfg.sampling.max_new_tokens = 8, 8
    cfg.micro_batch_size = 2
    return cfg


def _engine_programs(decoder, samples: int) -> dict[str, jax.stages.Lowered]:
    """The engine's prefill and decode chunk for PROMPTS prompts x `samples`, a slot per sample, each slot's blocks
    holding its PROMPT_BUCKET prompt positions and room for NEW_BUCKET more (the decode chunk's steps)."""
    from jaxgrpo import engine, sampler

    graphdef, state = nnx.split(decoder)
    slots, context = PROMPTS * samples, PROMPT_BUCKET + NEW_BUCKET
    traced = engine.trace_programs(graphdef, state, num_slots=slots, num_blocks=slots * context // BLOCK_SIZE + 1,
                                   block_size=BLOCK_SIZE, max_context=context, prefill_rows=PROMPTS,
                                   prompt_len=PROMPT_BUCKET, draws=slots, width=PROMPT_BUCKET, steps=NEW_BUCKET,
                                   sampling=sampler.SamplingParams())
    return {"prefill": traced["engine prefill"].lower(), "decode chunk": traced["engine decode"].lower()}


def _decode_step(decoder, with_prefix: bool):
    """One cached one-token call with a run-time cache index, as a decode loop makes it."""
    graphdef, state = nnx.split(decoder)
    rows, capacity = 4, 32
    cache = jax.eval_shape(lambda: decoder.init_cache(rows, capacity))
    prefix = jax.eval_shape(lambda: decoder.init_cache(rows // 2, 16)) if with_prefix else None
    prefix_mask = jax.ShapeDtypeStruct((rows // 2, 16), jnp.bool_) if with_prefix else None

    def step(state, tokens, cache, index, kv_mask, prefix, prefix_mask):
        model = nnx.merge(graphdef, state)
        return model(tokens, index + jnp.zeros((rows, 1), jnp.int32), cache=cache, cache_index=index, kv_mask=kv_mask,
                     prefix=prefix, prefix_mask=prefix_mask)

    return jax.jit(step).lower(state, jax.ShapeDtypeStruct((rows, 1), jnp.int32), cache,
                               jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((rows, capacity), jnp.bool_),
                               prefix, prefix_mask)


def programs() -> dict[str, str]:
    """{program name: its StableHLO text without debug information}."""
    from jaxgrpo import train
    from jaxgrpo.models import Decoder
    from jaxgrpo.tools import compile as aot

    texts = {}
    for short, model in MODELS.items():
        for dtype in DTYPES:
            cfg = _config(model, dtype)
            config = aot.decoder_config(cfg)
            decoder = nnx.eval_shape(lambda: Decoder(config, dtype=getattr(jnp, dtype),
                                                     param_dtype=getattr(jnp, dtype), rngs=nnx.Rngs(0)))
            lowered = {}
            for samples in (1, 4):
                for name, program in _engine_programs(decoder, samples).items():
                    lowered[f"engine {name}, G={samples}"] = program
            lowered["decode step"] = _decode_step(decoder, with_prefix=False)
            lowered["decode step, shared prefix"] = _decode_step(decoder, with_prefix=True)
            mesh = train.make_mesh(cfg, jax.devices()[:1])
            abstract = aot.abstract_train_state(cfg, mesh)
            lowered["train forward"] = aot.lower_forward(cfg, mesh, abstract)[0]
            lowered["train update"] = aot.lower_update(cfg, mesh, abstract)[0]
            for name, program in lowered.items():
                texts[f"{short} {dtype} {name}"] = program.as_text(debug_info=False)
    return texts


def _hashes_at(revision: str, dump: str | None) -> dict[str, str]:
    """This file's hashes for the tree at `revision`, run in a temporary detached worktree."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        tree = os.path.join(scratch, "tree")
        subprocess.run(["git", "worktree", "add", "--detach", tree, revision], cwd=root, check=True,
                       capture_output=True)
        try:
            command = [sys.executable, os.path.abspath(__file__), "--json"]
            if dump:
                command += ["--dump", dump]
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"the programs at {revision} did not lower:\n{out.stderr[-3000:]}")
            return json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=root, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", help="compare with the programs of this git revision")
    parser.add_argument("--dump", metavar="DIR", help="write each program's text under DIR (REV's under DIR/REV)")
    parser.add_argument("--json", action="store_true", help="print {program: sha256} as one JSON line")
    args = parser.parse_args()
    texts = programs()
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for name, text in texts.items():
            with open(os.path.join(args.dump, name.replace(" ", "_").replace(",", "") + ".mlir"), "w") as f:
                f.write(text)
    hashes = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()}
    if args.json:
        print(json.dumps(hashes))
        return
    if not args.against:
        for name, digest in hashes.items():
            print(f"{digest}  {name}")
        return
    theirs = _hashes_at(args.against, os.path.join(args.dump, args.against) if args.dump else None)
    width = max(map(len, hashes))
    print(f"{'program':<{width}}  {'this tree':<12}  {args.against:<12}  verdict")
    for name, digest in hashes.items():
        other = theirs.get(name)
        verdict = "missing there" if other is None else ("same" if other == digest else "DIFFERENT")
        print(f"{name:<{width}}  {digest[:12]}  {(other or '-')[:12]:<12}  {verdict}")
    same = sum(theirs.get(name) == digest for name, digest in hashes.items())
    print(f"{same} of {len(hashes)} programs the same")


if __name__ == "__main__":
    main()
