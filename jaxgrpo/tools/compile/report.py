"""The compile report: each program's memory per chip, the compiler's figures, the roofline estimates beside the
nearest measured run (`jaxgrpo.tools.calibration`), collectives and host transfers; `compile_experiment` compiles a
run's programs for a TPU topology and reports them."""

from __future__ import annotations

import dataclasses
import math

import jax
from flax import nnx

from jaxgrpo.config import Config, resolve_packing, validate
from jaxgrpo.distributed import batch_shards
from jaxgrpo.tools.compile.analysis import (collectives, count_products, host_transfers, itemsize, largest_values,
                                            per_chip_bytes)
from jaxgrpo.tools.compile.chips import GiB, Chip, topology_devices
from jaxgrpo.tools.compile.lowering import (OutOfMemory, abstract_train_state, compile_lowered, lower_engine,
                                            lower_forward, lower_update)


RUN_PROGRAMS = ("engine", "forward", "update")
"""The programs a run runs (`programs_of`): the rollout engine's prefill and decode chunk, the scoring forward and the
update."""
PROGRAMS = RUN_PROGRAMS
SAMPLER_PROGRAMS = ("engine",)  # on the sampler's chips under a split mesh
ENGINE_FILLS = (0.5, 1.0)
"""The rollout engine's fill levels (`--programs engine`): its pool holds this share of every slot's whole context."""


@dataclasses.dataclass
class ProgramReport:
    """What the TPU compiler reports for one program, per chip, with the roofline figures derived from it."""

    program: str
    fits: bool
    hbm_bytes: int  # arguments + outputs + temporaries - donated (aliased) bytes
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    hbm_capacity: int
    flops: float  # the compiler's count: each loop body once
    bytes_accessed: float
    compiler_seconds: float | None  # the compiler's time estimate ("optimal_seconds"), loop bodies once; None
    # where it is negative, as it comes out for programs with loops
    model_flops: float  # analytic per chip: 6·N (update) or 2·N (forward, decode) per token; a prefill's
    # `prefill_model_flops`
    model_flops_seconds: float  # model_flops at the chip's peak
    hbm_roofline_seconds: float  # bytes_accessed at the chip's HBM bandwidth
    step_floor_seconds: float | None  # decode: parameters + cache per chip at the chip's HBM bandwidth, per token
    program_flops: float  # per chip: the traced program's matrix products and Pallas calls, loop bodies times
    # their trip counts
    estimated_seconds: float  # per chip: their roofline (`count_products`), an estimate; decode: one step
    pallas_flops: float  # per chip: the Pallas calls' part of program_flops (their stated cost estimates)
    pallas_seconds: float  # the Pallas calls' part of estimated_seconds
    mfu: float | None  # estimated MFU, a roofline bound: model FLOPs / (peak x estimated_seconds); None where a
    # loop was counted once (decode)
    loops_counted_once: int  # `while` loops of run-time trip count (decode's token loop), counted once
    largest_values: list  # the largest arrays the compiled program computes (`largest_values`)
    collectives: dict
    host_transfers: list
    compile_seconds: float
    error: str | None = None  # why the compiler refused the program (it does not fit), else None
    pallas_calls_without_estimate: int = 0  # Pallas calls that state no cost estimate: not in the estimate
    memory_bound_bytes: float = 0.0  # per chip: what the other big operations move (`memory_bound_bytes_of`)
    memory_bound_seconds: float = 0.0  # those bytes at the chip's HBM bandwidth
    estimated_seconds_with_memory: float = 0.0  # estimated_seconds + memory_bound_seconds: the roofline estimate
    # with the memory-bound work
    mfu_with_memory: float | None = None  # estimated MFU at estimated_seconds_with_memory (a roofline bound too)
    calibration: dict | None = None  # the measured run nearest this program (`jaxgrpo.tools.calibration.nearest`):
    # its fields with "factor" (measured / products' estimate) and "factor_with_memory"; None where none is
    kv_pool_bytes: int | None = None  # the engine's programs: its KV pool's bytes per chip
    live_tokens: int | None = None  # the engine's programs: positions that pool holds, over all slots

    def calibration_note(self, chip: str, with_memory: bool = False) -> str:
        """'measured 3.0x this on an H200, jax 0.11.2 ...' for the estimate (with the memory-bound work or not)."""
        from jaxgrpo.tools import calibration

        row = None
        if self.calibration:
            fields = {k: v for k, v in self.calibration.items() if k in calibration.Calibration._fields}
            row = calibration.Calibration(**fields)
        return calibration.note(row, chip, with_memory)

    def estimate_lines(self, chip: str) -> list[str]:
        """The two roofline estimates, products alone and with the memory-bound work, each labelled as a bound
        with how far the nearest measured run was from it, and the estimated MFU each implies."""
        products = (f"estimated {_duration(self.estimated_seconds)} (roofline bound, the products alone: "
                    f"{self.program_flops:.3g} FLOPs, Pallas calls {self.pallas_flops:.3g} FLOPs in "
                    f"{_duration(self.pallas_seconds)}; {self.calibration_note(chip)})")
        memory = (f"estimated {_duration(self.estimated_seconds_with_memory)} with the memory-bound work (roofline "
                  f"bound: the products and the {self.memory_bound_bytes / GiB:.2f} GiB per chip other operations "
                  f"move at HBM bandwidth, {_duration(self.memory_bound_seconds)}; "
                  f"{self.calibration_note(chip, with_memory=True)})")
        if self.mfu is not None:
            products += f"; estimated MFU {100 * self.mfu:.0f}% (roofline bound)"
        if self.mfu_with_memory is not None:
            memory += f"; estimated MFU {100 * self.mfu_with_memory:.0f}% (roofline bound)"
        return [products, memory]


def _duration(seconds: float) -> str:
    """'1.52 s', '12.40 ms' or '3.1 us'."""
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclasses.dataclass
class Report:
    topology: str
    chip: str
    chips: int
    hosts: int
    mesh: dict
    model: str
    num_params: int
    programs: list
    attention: str  # the attention implementation the programs were traced with ("auto" resolved)
    lora: dict | None = None  # the run's `LoraConfig` fields, None for a full fine-tune
    num_trained: int = 0  # the parameters that train (with LoRA the adapters, else num_params)
    #: A split mesh (`mesh.rollout_devices`): the sampler's chips, its mesh, the programs on it and the bytes of
    #: weights moved to it after each update; None when sampler and learner share the chips (`mesh` above).
    rollout: dict | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def table(self) -> str:
        """A human-readable summary, one line per program."""
        trained = "" if not self.lora else (
            f", LoRA rank {self.lora['rank']} ({self.num_trained / 1e6:.1f}M trained"
            f"{', base ' + self.lora['quantize_base'] if self.lora['quantize_base'] else ''})")
        lines = [f"{self.model} ({self.num_params / 1e6:.1f}M parameters{trained}) on {self.topology}: {self.chips} x "
                 f"{self.chip}, {self.hosts} host(s), mesh {self.mesh}, attention {self.attention}"]
        if self.rollout:
            r = self.rollout
            lines.append(f"  split: the learner on {self.chips - r['chips']} chips (mesh {self.mesh}), the sampler on "
                         f"{r['chips']} (mesh {r['mesh']}: {', '.join(r['programs']) or 'no program compiled'}); "
                         f"weights moved to the sampler after each update: {r['weight_transfer_bytes'] / 2**20:.1f} MiB")
        for p in self.programs:
            estimate = "no time estimate" if p.compiler_seconds is None else f"{p.compiler_seconds * 1e3:.2f} ms"
            step = "" if p.step_floor_seconds is None else f"; a step's HBM floor {p.step_floor_seconds * 1e3:.3f} ms"
            per_step = f" ({p.loops_counted_once} run-time loop(s) counted once)" if p.loops_counted_once else ""
            if p.pallas_calls_without_estimate:
                per_step += f" ({p.pallas_calls_without_estimate} Pallas call(s) without a cost estimate, not counted)"
            if p.error:
                lines.append(f"  {p.program:8s} DOES NOT FIT: the compiler refused it: {p.error}")
                continue
            moved = ", ".join(f"{k} x{v['count']} ({v['bytes'] / 2**20:.1f} MiB)" for k, v in p.collectives.items()
                              if v["count"]) or "none"
            lines.append(
                f"  {p.program:8s} {'fits' if p.fits else 'DOES NOT FIT'}: {p.hbm_bytes / GiB:.2f} of "
                f"{p.hbm_capacity / GiB:.0f} GiB per chip (arguments {p.argument_bytes / GiB:.2f}, temporaries "
                f"{p.temp_bytes / GiB:.2f}, outputs {p.output_bytes / GiB:.2f}, donated {p.alias_bytes / GiB:.2f}); "
                f"model FLOPs {p.model_flops:.3g} per chip = {p.model_flops_seconds * 1e3:.2f} ms at peak; compiler: "
                f"{p.flops:.3g} FLOPs, {p.bytes_accessed / 2**20:.1f} MiB accessed, {estimate} "
                f"(loop bodies once){step}; collectives: {moved}; host transfers: "
                f"{', '.join(p.host_transfers) or 'none'}; compiled in {p.compile_seconds:.1f} s")
            if p.kv_pool_bytes is not None:
                lines.append(f"  {'':8s} KV pool {p.kv_pool_bytes / GiB:.3f} GiB per chip for {p.live_tokens} live "
                             f"positions, {p.kv_pool_bytes / p.live_tokens / 1024:.1f} KiB each")
            # The estimates, loops x trip counts, each labelled with how far the nearest measured run was from it.
            lines += [f"  {'':8s} {line}{per_step}" for line in p.estimate_lines(self.chip)]
        return "\n".join(lines)


def prefill_model_flops(matmul_params: int, unembedding: int, prompt_tokens: int, logit_rows: int) -> float:
    """A prefill's model FLOPs: 2·N per prompt token (N = `matmul_params`, `Abstract.matmul_params`), less the
    unembedding's 2·V·E (`unembedding` = V·E parameters) at every position but the `logit_rows` whose logits it
    computes (each row's last: what it draws from). Counting 2·N at every prompt token made a prefill's estimated
    MFU exceed 100%."""
    return 2 * (matmul_params - unembedding) * prompt_tokens + 2 * unembedding * logit_rows


def update_model_flops(abstract, tokens: int) -> float:
    """An update's model FLOPs: 6·N per trained token, the forward (2·N), the activations' gradients (2·N) and the
    weights' (2·N); with LoRA the frozen weights get no gradient (4·N, and 6 per adapter parameter). N counts the
    parameters a token multiplies by (`Abstract.matmul_params`: not an untied input embedding)."""
    return (6 * abstract.matmul_trained + 4 * (abstract.matmul_params - abstract.matmul_trained)) * tokens


def program_report(name: str, compiled, seconds: float, jaxpr, chip: Chip, chips: int, model_flops: float,
                    step_floor_bytes: int | None = None, calibrations=None, packing: bool | None = None) -> ProgramReport:
    from jaxgrpo.tools import calibration

    products = count_products(jaxpr, chip.peak_flops * chips, chip.hbm_bandwidth * chips)
    with_memory = products.with_memory_seconds
    row = calibration.nearest(calibration.MEASURED if calibrations is None else calibrations, chip.name, name, packing)
    # What every estimate below gets beside it: the measured run nearest this program, and its factors.
    estimates = dict(
        memory_bound_bytes=products.memory_bound_bytes / chips, memory_bound_seconds=products.memory_bound_seconds,
        estimated_seconds_with_memory=with_memory,
        calibration=None if row is None else {**row._asdict(), "factor": row.factor,
                                              "factor_with_memory": row.factor_with_memory})
    if isinstance(compiled, OutOfMemory):
        # What the compiler said it needs (temporaries, or all of it) stands for the whole; no cost analysis.
        return ProgramReport(
            program=name, fits=False, hbm_bytes=compiled.required_bytes(), argument_bytes=0, output_bytes=0,
            temp_bytes=compiled.required_bytes(), alias_bytes=0, hbm_capacity=chip.hbm_bytes, flops=0.0,
            bytes_accessed=0.0, compiler_seconds=None, model_flops=model_flops / chips,
            model_flops_seconds=model_flops / chips / chip.peak_flops, hbm_roofline_seconds=0.0,
            step_floor_seconds=None if step_floor_bytes is None else step_floor_bytes / chip.hbm_bandwidth,
            program_flops=products.flops / chips, estimated_seconds=products.roofline_seconds,
            pallas_flops=products.pallas_flops / chips, pallas_seconds=products.pallas_seconds, mfu=None,
            loops_counted_once=products.loops_counted_once, largest_values=[], collectives={}, host_transfers=[],
            compile_seconds=seconds, error=compiled.message,
            pallas_calls_without_estimate=products.pallas_calls_without_estimate, **estimates)
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
             - memory.alias_size_in_bytes)
    flops_per_chip = model_flops / chips
    bytes_accessed = float(cost.get("bytes accessed", 0.0))
    # Global shapes: a chip does its share of every product (the mesh splits each one over all chips).
    estimated = products.roofline_seconds
    return ProgramReport(
        program=name, fits=total <= chip.hbm_bytes, hbm_bytes=int(total),
        argument_bytes=int(memory.argument_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes), alias_bytes=int(memory.alias_size_in_bytes),
        hbm_capacity=chip.hbm_bytes, flops=float(cost.get("flops", 0.0)), bytes_accessed=bytes_accessed,
        compiler_seconds=estimate if (estimate := float(cost.get("optimal_seconds", -1.0))) > 0 else None,
        model_flops=flops_per_chip,
        model_flops_seconds=flops_per_chip / chip.peak_flops, hbm_roofline_seconds=bytes_accessed / chip.hbm_bandwidth,
        step_floor_seconds=None if step_floor_bytes is None else step_floor_bytes / chip.hbm_bandwidth,
        program_flops=products.flops / chips, estimated_seconds=estimated,
        pallas_flops=products.pallas_flops / chips, pallas_seconds=products.pallas_seconds,
        mfu=(flops_per_chip / chip.peak_flops / estimated) if estimated > 0 and not products.loops_counted_once else None,
        loops_counted_once=products.loops_counted_once, largest_values=largest_values(text),
        collectives=collectives(text), host_transfers=host_transfers(text), compile_seconds=seconds,
        pallas_calls_without_estimate=products.pallas_calls_without_estimate,
        mfu_with_memory=(flops_per_chip / chip.peak_flops / with_memory)
        if with_memory > 0 and not products.loops_counted_once else None, **estimates)


def programs_of(cfg: Config) -> tuple[str, ...]:
    """The programs a run of `cfg` runs: the rollout engine's, the scoring forward and the update."""
    return RUN_PROGRAMS


def compile_experiment(cfg: Config, topology: str, programs=None, cpu_forms: bool = False,
                       calibrations=None) -> Report:
    """Compiles `programs` of `cfg` (default: those its run runs, `programs_of`) for `topology` and reports each;
    nothing runs and no weights are read.
    `cpu_forms` traces the decoder's CPU-specific forms (`jaxgrpo.models.backend.force_cpu_forms`) too, to compare them.
    `calibrations`: the measured runs each estimate is compared with (`jaxgrpo.tools.calibration.load`; default the
    committed ones, `calibration.MEASURED`)."""
    from jaxgrpo.models import backend

    with backend.force_cpu_forms(cpu_forms):
        return _compile_experiment(cfg, topology, programs_of(cfg) if programs is None else tuple(programs),
                                   calibrations)


def _compile_experiment(cfg: Config, topology: str, programs, calibrations=None) -> Report:
    from jaxgrpo import train
    from jaxgrpo.train import preflight

    unknown = [p for p in programs if p not in PROGRAMS]
    if {"prefill", "decode"} & set(unknown):
        raise ValueError("programs prefill and decode were sampler.generate's fixed batch, removed when the rollout "
                         "engine became the only sampler; ask for engine (its prefill and decode chunk)")
    if unknown:
        raise ValueError(f"unknown program(s) {', '.join(unknown)}; valid: {', '.join(PROGRAMS)}")
    chip, devices = topology_devices(topology)
    cfg = resolve_packing(cfg, devices[0].platform)
    split = cfg.mesh.rollout_devices
    preflight.check_rollout_split(cfg, len(devices), f"{topology}'s {len(devices)} chips")
    learner_devices, sampler_devices = devices[:len(devices) - split], devices[len(devices) - split:]
    mesh = train.make_mesh(cfg, learner_devices)
    validate(cfg, row_shards=batch_shards(mesh))
    abstract = abstract_train_state(cfg, mesh)
    n, chips, reports = abstract.matmul_params, len(learner_devices), []  # the N of 2·N and 6·N
    policy = nnx.merge(abstract.graphdef, abstract.state.params, abstract.rest)
    unembedding = policy.decoder.config.vocab_size * policy.decoder.config.hidden_size
    # The sampler's programs run on its own chips (`mesh.rollout_devices`: one-step-off), or on the learner's.
    sampler_mesh, sampler_abstract, sampler_chips = mesh, abstract, chips
    rollout = None
    if split:
        sampler_mesh = train.rollout_mesh(sampler_devices)
        sampler_abstract, sampler_chips = abstract_train_state(cfg, sampler_mesh), split
        # After each update the behaviour policy's weights (the trained ones) go learner -> sampler.
        moved = sum(math.prod(leaf.shape) * itemsize(leaf.dtype) for leaf in jax.tree.leaves(abstract.state.params))
        rollout = {"chips": split, "mesh": dict(sampler_mesh.shape), "weight_transfer_bytes": moved,
                   "programs": [p for p in programs if p in SAMPLER_PROGRAMS]}
    if "engine" in programs:
        # A multi-process run's engines are one per process, on its own chips with its share of the rows and its copy
        # of the weights split over them (`Trainer.engine`, `train.process_sampler_mesh`): one process's is compiled.
        processes = len({d.process_index for d in devices})
        engine_mesh, engine_abstract, engine_chips = sampler_mesh, sampler_abstract, sampler_chips
        if processes > 1:  # process 0's chips: its learner's, or its share of `mesh.rollout_devices`
            own = [d for d in devices if d.process_index == 0]
            own = own[len(own) - split // processes:] if split else own
            engine_mesh, engine_chips = train.process_sampler_mesh(own), len(own)
            engine_abstract = abstract_train_state(cfg, engine_mesh)
        for fill in ENGINE_FILLS:
            e = lower_engine(cfg, engine_mesh, engine_abstract, fill, processes=processes)
            if fill == ENGINE_FILLS[0]:  # the prefill reads no cached positions: one fill level tells it
                reports.append(dataclasses.replace(
                    program_report("engine prefill", *e.prefill, chip, engine_chips,
                                   prefill_model_flops(n, unembedding, e.prompt_tokens, e.draws), calibrations=calibrations), kv_pool_bytes=e.pool_bytes, live_tokens=e.live_tokens))
            floor = per_chip_bytes((engine_abstract.state.params, engine_abstract.rest)) + e.pool_bytes
            reports.append(dataclasses.replace(
                program_report(f"engine decode {fill:.0%} full", *e.decode, chip, engine_chips,
                                2 * n * e.decode_tokens,
                                floor, calibrations=calibrations), kv_pool_bytes=e.pool_bytes,
                live_tokens=e.live_tokens))
    if "forward" in programs:
        lowered, tokens, jaxpr = lower_forward(cfg, mesh, abstract)
        reports.append(program_report("forward", *compile_lowered(lowered), jaxpr, chip, chips, 2 * n * tokens,
                                       calibrations=calibrations))
    if "update" in programs:
        lowered, tokens, jaxpr = lower_update(cfg, mesh, abstract)
        reports.append(program_report("update", *compile_lowered(lowered), jaxpr, chip, chips,
                                       update_model_flops(abstract, tokens), calibrations=calibrations,
                                       packing=cfg.packing))
    hosts = len({d.process_index for d in devices})
    attention = policy.decoder.attention_implementation(mesh.abstract_mesh).name
    return Report(topology, chip.name, len(devices), hosts, dict(mesh.shape), cfg.model, abstract.num_params, reports,
                  attention, dataclasses.asdict(cfg.lora) if cfg.lora else None, abstract.num_trained, rollout)


def fits_everywhere(report: Report) -> bool:
    return all(p.fits for p in report.programs)
