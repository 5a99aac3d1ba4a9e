"""Ahead-of-time compilation of a run's training programs for a TPU topology, on any machine, and their report.

libtpu compiles for a TPU topology without a TPU: `jax.experimental.topologies` describes the topology's
chips, a mesh is laid over them as the experiment's mesh config says, the model is built from shapes
alone (no weights are read), and `jax.jit(...).lower(abstract inputs).compile()` gives what XLA's TPU
compiler decided: memory per chip, FLOPs and bytes, its time estimate, and the compiled HLO, which
shows the collectives. Programs compiled here, each at the experiment's shapes (by default those a run runs,
`RUN_PROGRAMS`):

* `engine`: the rollout engine's programs (`jaxgrpo.engine.trace_programs`), the trainer's sampler: its prefill,
  and a chunk of decode steps over one slot per sample at two fill levels (`ENGINE_FILLS`: a pool holding half
  and all of every slot's context), each with its KV pool's bytes per chip: KV memory follows the live
  positions, in whole blocks;
* `forward`: the reference / old-policy log-prob forward (`jaxgrpo.train.step.make_forward_fn`) over a batch;
* `update`: one optimizer step of `jaxgrpo.train.step.make_update_fn` over a minibatch of micro-batches (packed
  groups at their worst case, one group per row, when `packing` is on);

The compiler's cost analysis counts a loop body once, whatever its trip count (the update's micro-batch
scan, the decoder's layer scan, the decode loop): its FLOPs and time are lower bounds. So the report also
counts the traced program's matrix products with every scan body times its length (`count_products`:
remat's recomputation and attention included), and each Pallas call at the analytic `cost_estimate` it
states (splash attention: the blocks its mask visits, `pallas_tpu.splash_cost_estimates`; the decode
kernel: a full cache, `pallas_decode.full_cache_cost_estimate`, over a paged pool at most the pool's positions,
`paged_cost_estimate`), estimates the time as their roofline,
each at max(FLOPs / peak, bytes / HBM bandwidth), with the Pallas calls' share apart (`pallas_seconds`),
and gives the estimated MFU (a roofline bound) that time implies for the model's analytic FLOPs (2·N per
token forward, 6·N per token trained, N the parameters a token multiplies by: `Abstract.matmul_params`, not an
untied input embedding, which is a lookup; a prefill, which computes logits only at the rows it draws from, less
the unembedding's 2·V·E at the other positions: `prefill_model_flops`). The products leave out the
memory-bound work (element-wise operations, reductions, transposes, gathers and slices over the big arrays),
so the report also gives the roofline with it: the products' time plus the bytes those operations move at
HBM bandwidth (`memory_bound_bytes_of`), and the estimated MFU at that time. A `while` loop whose trip count
is known only at run time (the decode loop) is counted once: its figures are one step's.
For the decode loop, whose body is one step, it also gives the step's HBM floor: the parameters and the
whole cache a chip holds, read once per token at the chip's bandwidth.

Every figure here is an estimate: nothing runs. Beside each estimated time and MFU the report prints how far
the nearest real run was from the same estimate (`jaxgrpo.tools.calibration`: measured / estimated seconds, with the
chip and jax version). Qwen3-0.6B's update on an H200 took 3.0x the products' estimate with packing off and

The package: `chips` (the TPU generations' figures, a topology's devices), `lowering` (the programs traced and
lowered from shapes alone), `analysis` (what a program does, read from its HLO and jaxpr: collectives, products,
memory-bound work) and `report` (each program's figures, `compile_experiment`).
"""

from jaxgrpo.tools.compile.analysis import (COLLECTIVES, HOST_TRANSFERS, MEMORY_BOUND_MIN_BYTES, ProductCount,
                                            collectives, count_products, host_transfers, largest_values,
                                            memory_bound_bytes_of, per_chip_bytes)
from jaxgrpo.tools.compile.chips import CHIPS, EXAMPLE_TOPOLOGIES, GiB, Chip, topology_devices
from jaxgrpo.tools.compile.lowering import (ENGINE_BLOCK_SIZE, ENGINE_DECODE_CHUNK, Abstract, EnginePrograms,
                                            OutOfMemory, abstract_train_state, compile_lowered, decoder_config,
                                            lower_engine, lower_forward, lower_update)
from jaxgrpo.tools.compile.report import (ENGINE_FILLS, PROGRAMS, RUN_PROGRAMS, SAMPLER_PROGRAMS,
                                          ProgramReport, Report, compile_experiment, fits_everywhere,
                                          prefill_model_flops, program_report, programs_of, update_model_flops)

__all__ = ["CHIPS", "COLLECTIVES", "ENGINE_BLOCK_SIZE", "ENGINE_DECODE_CHUNK", "ENGINE_FILLS", "EXAMPLE_TOPOLOGIES",
           "HOST_TRANSFERS", "MEMORY_BOUND_MIN_BYTES", "PROGRAMS", "RUN_PROGRAMS",
           "SAMPLER_PROGRAMS", "Abstract",
           "Chip", "EnginePrograms", "GiB", "OutOfMemory", "ProductCount", "ProgramReport", "Report",
           "abstract_train_state", "collectives", "compile_experiment", "compile_lowered", "count_products",
           "decoder_config", "fits_everywhere", "host_transfers", "largest_values", "lower_engine", "lower_forward",
           "lower_update", "memory_bound_bytes_of", "per_chip_bytes", "prefill_model_flops",
           "program_report", "programs_of", "topology_devices", "update_model_flops"]
