"""The rollout engine: continuous batching over a paged KV cache, with a session API for multi-turn.

`Engine` (`engine`) schedules `Request`s into decode slots and returns `Completion`s (`sequences`: both, its record
of a live sequence, the shared-prefix plan of a decode chunk); `blocks` counts the cache's blocks on the host,
`paged` reads and writes them on the device, `programs` are the compiled prefill, decode and block-copy programs
the engine runs; `groups` samples G completions per prompt (`generate_groups` through an engine; `generate` and `generate_text`
through one made for the call), and `multi_turn` runs environment episodes in token space.
"""

from jaxgrpo.engine.blocks import BlockAllocator, OutOfBlocks
from jaxgrpo.engine.engine import Engine
from jaxgrpo.engine.groups import generate, generate_groups, generate_text
from jaxgrpo.engine.paged import PagedKVCache
from jaxgrpo.engine.programs import compilation_counts, trace_programs
from jaxgrpo.engine.sequences import Completion, Request

__all__ = ["BlockAllocator", "Completion", "Engine", "OutOfBlocks", "PagedKVCache", "Request", "compilation_counts",
           "generate", "generate_groups", "generate_text", "trace_programs"]
