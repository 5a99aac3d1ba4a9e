"""The rollout engine: continuous batching over a paged KV cache, with a session API for multi-turn.

`Engine` schedules `Request`s into decode slots and returns `Completion`s; `blocks` counts the cache's
blocks on the host, `paged` reads and writes them on the device.
"""

from jaxgrpo.engine.blocks import BlockAllocator, OutOfBlocks
from jaxgrpo.engine.engine import Completion, Engine, Request, compilation_counts, generate_groups, trace_programs
from jaxgrpo.engine.paged import PagedKVCache

__all__ = ["BlockAllocator", "Completion", "Engine", "OutOfBlocks", "PagedKVCache", "Request", "compilation_counts", "generate_groups",
           "trace_programs"]
