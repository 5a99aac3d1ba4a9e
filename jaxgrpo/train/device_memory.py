"""A program that does not fit the device's memory, said in one line: which program, what it needs, what to change.

XLA reports a program too big for the device as RESOURCE_EXHAUSTED, from the compiler (buffer assignment, GEMM
autotuning on a GPU: `XlaRuntimeError: RESOURCE_EXHAUSTED: ... 59.57GiB`) or at run time (an allocation that
fails), in a message of many lines that names HLO buffers, not config fields. The trainer runs its programs
inside `reported(cfg, program, mesh)`, which turns that status into `jaxgrpo.errors.OutOfDeviceMemory`:

    the update does not fit in device memory: XLA could not allocate 59.57 GiB on a device of 139.81 GiB
    (RESOURCE_EXHAUSTED); try micro_batch_size=8 (now 16), packing=false, optimizer.state_dtype=bfloat16, or
    fewer tokens per row (sampling.max_new_tokens, now 512)

with the XLA error chained as its cause (`raise ... from`), so nothing of it is lost. `jaxgrpo-train` prints it as
one line and exits 1. Each program gets the fields that shrink it: the update (one optimizer step over a
minibatch, `step.make_update_fn`) its micro-batch, remat (and its policy), dtype, packing, optimizer-state dtype
and row length; the sampler (the rollout engine's prefill and decode) and the scoring forward (reference and
old-policy log-probs over the whole batch, `step.make_forward_fn`) their rows, tokens and dtype; the warm-up's
update (the whole batch in one micro-batch) its rows. The sampler's and the update's failures at run time surface
when their results are read, which the trainer does inside the same block.
"""

from __future__ import annotations

import contextlib
import dataclasses

from jaxgrpo.config import Config, validate
from jaxgrpo.distributed import batch_shards
from jaxgrpo.errors import ConfigError, OutOfDeviceMemory, device_memory_bytes, is_resource_exhausted, requested_bytes

GiB = 1 << 30

#: The programs the trainer runs, by the name the message gives them.
PROGRAMS = ("update", "warm-up update", "sampler", "scoring forward")


def smaller_micro_batch(cfg: Config, row_shards: int | None = None) -> int | None:
    """The largest micro-batch below the current one that the config still accepts (it divides the minibatch,
    holds whole groups under packing, splits over the mesh's `row_shards`: data x fsdp), or None where there is
    none."""
    minibatch, micro = cfg.minibatch_size, cfg.micro_batch_rows
    for candidate in range(micro - 1, 0, -1):
        if minibatch % candidate:
            continue
        try:
            validate(dataclasses.replace(cfg, micro_batch_size=candidate), row_shards=row_shards)
        except ConfigError:
            continue
        return candidate
    return None


def suggestions(cfg: Config, program: str, row_shards: int | None = None) -> list[str]:
    """The config changes that shrink `program`'s memory, each as `field=value` (or the field to lower), only
    those that change something in `cfg`."""
    s = cfg.sampling
    tokens = f"fewer tokens per row (sampling.max_new_tokens, now {s.max_new_tokens})"
    bf16 = ["dtype=bfloat16"] if cfg.dtype == "float32" else []
    if program in ("update", "warm-up update"):
        found = []
        if program == "update":
            micro = cfg.micro_batch_rows
            smaller = smaller_micro_batch(cfg, row_shards)
            unpacked = smaller_micro_batch(dataclasses.replace(cfg, packing=False), row_shards) if cfg.packing else None
            if smaller is not None:
                found.append(f"micro_batch_size={smaller} (now {micro})")
            elif unpacked is not None:  # packing holds whole groups a micro-batch; without it, fewer rows fit
                found.append(f"micro_batch_size={unpacked} (now {micro}) with packing=false")
        else:  # the warm-up's update takes the whole batch in one micro-batch
            found.append(f"fewer rows (prompts_per_step x group_size, now {cfg.batch_size})")
        if not cfg.remat:
            found.append("remat=true")
        elif cfg.remat_policy != "full":  # a policy keeps more than the layers' inputs
            found.append(f"remat_policy=full (now {cfg.remat_policy})")
        found += bf16
        if cfg.packing:
            found.append("packing=false")
        if cfg.optimizer.state_dtype == "float32":
            found.append("optimizer.state_dtype=bfloat16")
        return found + [tokens]
    if program == "sampler":
        return [f"fewer rows (prompts_per_step, now {cfg.prompts_per_step}, or group_size, now {cfg.group_size}; "
                f"task.num_eval_examples, now {cfg.task.num_eval_examples}, in evaluation)", *bf16,
                f"fewer tokens (sampling.max_new_tokens, now {s.max_new_tokens}; sampling.max_prompt_len, now "
                f"{s.max_prompt_len})"]
    return [f"fewer rows (prompts_per_step x group_size, now {cfg.batch_size})", *bf16, tokens]


def message(cfg: Config, program: str, error: BaseException, device=None, row_shards: int | None = None) -> str:
    """The one line for `error` (a RESOURCE_EXHAUSTED) raised by `program`."""
    needed = requested_bytes(str(error))
    has = None if device is None else device_memory_bytes(device)
    what = f"XLA could not allocate {needed / GiB:.2f} GiB" if needed else "XLA ran out of memory"
    where = f" on a device of {has / GiB:.2f} GiB" if has else ""
    fixes = suggestions(cfg, program, row_shards)
    fix = ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1]
    return f"the {program} does not fit in device memory: {what}{where} (RESOURCE_EXHAUSTED); try {fix}"


@contextlib.contextmanager
def reported(cfg: Config, program: str, mesh=None):
    """Runs the block; XLA's RESOURCE_EXHAUSTED from it becomes `OutOfDeviceMemory` with `message`, the XLA
    error chained. `mesh`: the devices the program runs on (the first one's memory is quoted)."""
    try:
        yield
    except Exception as error:
        if not is_resource_exhausted(error):
            raise
        devices = list(mesh.devices.flat) if mesh is not None else []
        shards = None if mesh is None else batch_shards(mesh)  # what a micro-batch's rows split over
        raise OutOfDeviceMemory(message(cfg, program, error, devices[0] if devices else None, shards)) from error
