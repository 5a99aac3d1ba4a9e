"""The host side of the paged KV cache: which blocks are free, which sequence holds which.

The device holds a pool of `num_blocks` fixed-size blocks of keys and values (`jaxgrpo.engine.paged`);
this module only counts. A sequence's *block table* lists the blocks its positions live in, in order
(position p sits in block `table[p // block_size]` at offset `p % block_size`). Blocks are reference
counted so the G samples of a prompt can hold the prompt's full blocks together (prefix sharing); a
block returns to the free list when its last holder releases it. Block 0 is never handed out: the
device programs write a padded row's keys there (the null block).
"""

from __future__ import annotations

import dataclasses

from jaxgrpo.models import paged_cache

NULL_BLOCK = paged_cache.NULL_BLOCK


def blocks_for(length: int, block_size: int) -> int:
    """How many blocks hold `length` positions."""
    return -(-int(length) // int(block_size))


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than a request needs (the engine admits only what fits)."""


@dataclasses.dataclass
class BlockAllocator:
    """A free list of blocks [1, num_blocks) with reference counts.

    Attributes:
      num_blocks: the pool's size, the null block included.
      block_size: positions per block.
    """

    num_blocks: int
    block_size: int

    def __post_init__(self):
        if self.num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        # Popped from the end: low ids first, so a fresh engine's layout is easy to read in a debugger.
        self._free = list(range(self.num_blocks - 1, 0, -1))
        self._references = [0] * self.num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - 1 - len(self._free)

    def allocate(self, count: int) -> list[int]:
        """`count` fresh blocks, each with one reference."""
        if count > len(self._free):
            raise OutOfBlocks(f"{count} blocks needed but {len(self._free)} of {self.num_blocks - 1} are free")
        blocks = [self._free.pop() for _ in range(count)]
        for block in blocks:
            self._references[block] = 1
        return blocks

    def share(self, blocks: list[int]) -> list[int]:
        """One more reference to each of `blocks` (another sequence reads them); returns them."""
        for block in blocks:
            if self._references[block] < 1:
                raise ValueError(f"block {block} is free; only held blocks can be shared")
            self._references[block] += 1
        return list(blocks)

    def references(self, block: int) -> int:
        return self._references[block]

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each of `blocks`; those no one holds any more become free."""
        for block in blocks:
            if self._references[block] < 1:
                raise ValueError(f"block {block} released more often than it was held")
            self._references[block] -= 1
            if self._references[block] == 0:
                self._free.append(block)
