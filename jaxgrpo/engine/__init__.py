"""The rollout engine: continuous batching over a paged KV cache, with a session API for multi-turn.

`Engine` schedules `Request`s into decode slots and returns `Completion`s; `blocks` counts the cache's
blocks on the host, `paged` reads and writes them on the device, `programs` are the compiled prefill, decode
and block-copy programs the engine runs.
"""

from jaxgrpo.engine.blocks import BlockAllocator, OutOfBlocks
from jaxgrpo.engine.engine import Completion, Engine, Request, generate_groups
from jaxgrpo.engine.paged import PagedKVCache
from jaxgrpo.engine.programs import compilation_counts, trace_programs

__all__ = ["BlockAllocator", "Completion", "Engine", "OutOfBlocks", "PagedKVCache", "Request", "compilation_counts", "generate_groups",
           "trace_programs"]
