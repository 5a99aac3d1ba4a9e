"""The rollout engine: continuous batching over a paged KV cache, with a session API for multi-turn.

`Engine` (`engine`) schedules `Request`s into decode slots and returns `Completion`s (`sequences`: both, its record
of a live sequence, the shared-prefix plan of a decode chunk); `blocks` counts the cache's blocks on the host,
`paged` reads and writes them on the device, `programs` are the compiled prefill, decode and block-copy programs
the engine runs; `groups` samples G completions per prompt as the fixed-batch sampler returns them, and
`multi_turn` runs environment episodes in token space.
"""

from jaxgrpo.engine.blocks import BlockAllocator, OutOfBlocks
from jaxgrpo.engine.engine import Engine
from jaxgrpo.engine.groups import generate_groups
from jaxgrpo.engine.paged import PagedKVCache
from jaxgrpo.engine.programs import compilation_counts, trace_programs
from jaxgrpo.engine.sequences import Completion, Request

__all__ = ["BlockAllocator", "Completion", "Engine", "OutOfBlocks", "PagedKVCache", "Request", "compilation_counts",
           "generate_groups", "trace_programs"]
