"""Response cache: lets a repeated set of requests skip the full negotiation exchange.

Every rank holds the same cache (it changes only through responses, which are identical on
all ranks), so a cached request is identified by a bit position. A negotiation round is then
one bitwise-AND all-reduce of those bits instead of an all-gather of announcements.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from dlcomm.engine.negotiation import Response
from dlcomm.engine.request import CACHEABLE, Signature

FLAG_WORDS = 1  # word 0 holds flags; bits of cached responses start at word 1


class ResponseCache:
    """An LRU map name -> (bit, response), identical on every rank."""

    def __init__(self, capacity: int, rank: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.rank = rank
        # Bits of responses whose process set excludes this rank: always "ready" here.
        self._outsider_bits: set[int] = set()
        self._by_name: OrderedDict[str, tuple[int, Response]] = OrderedDict()
        self._by_bit: dict[int, str] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0

    def __len__(self) -> int:
        return len(self._by_name)

    def lookup(self, name: str, rank: int, signature: Signature) -> int | None:
        """The bit of ``name`` if cached with the same signature from ``rank``."""
        hit = self._by_name.get(name)
        if hit is None or hit[1].signatures.get(rank) != signature:
            return None
        return hit[0]

    def response(self, bit: int) -> Response:
        return self._by_name[self._by_bit[bit]][1]

    def put(self, response: Response) -> None:
        """Remember a successful response (call on every rank in the same order)."""
        if self.capacity == 0 or response.error or response.kind not in CACHEABLE:
            return
        if response.joined:
            return
        if response.name in self._by_name:
            bit = self._by_name.pop(response.name)[0]
        else:
            if len(self._by_name) >= self.capacity:
                _, (old_bit, _) = self._by_name.popitem(last=False)
                del self._by_bit[old_bit]
                self._outsider_bits.discard(old_bit)
                self._free_bits.append(old_bit)
            if self._free_bits:
                bit = min(self._free_bits)
                self._free_bits.remove(bit)
            else:
                bit, self._next_bit = self._next_bit, self._next_bit + 1
        self._by_name[response.name] = (bit, response)
        self._by_bit[bit] = response.name
        if self.rank in response.members:
            self._outsider_bits.discard(bit)
        else:
            self._outsider_bits.add(bit)

    def mark_outsider_bits(self, words: np.ndarray) -> None:
        """Set the bits of cached requests this rank does not take part in."""
        self.set_bits(words, list(self._outsider_bits))

    def touch(self, bit: int) -> None:
        """Mark the response as recently used (LRU order, same on all ranks)."""
        self._by_name.move_to_end(self._by_bit[bit])

    def num_words(self) -> int:
        """64-bit words needed for the flags plus every bit in use."""
        return FLAG_WORDS + (self._next_bit + 63) // 64

    @staticmethod
    def set_bit(words: np.ndarray, bit: int) -> None:
        words[FLAG_WORDS + bit // 64] |= np.uint64(1) << np.uint64(bit % 64)

    @staticmethod
    def set_bits(words: np.ndarray, bits: list[int]) -> None:
        """``set_bit`` for many bits at once: one Python integer, converted once (a numpy
        scalar operation per bit costs more than the rest of a cached request's round)."""
        if not bits:
            return
        mask = 0
        for bit in bits:
            mask |= 1 << bit
        count = len(words) - FLAG_WORDS
        extra = np.frombuffer(mask.to_bytes(8 * count, "little"), dtype="<u8")
        words[FLAG_WORDS:] |= extra.astype(words.dtype, copy=False)

    def ready_bits(self, words: np.ndarray) -> list[int]:
        """Bits set in an AND-reduced word array, ascending (the global order)."""
        bits = []
        for w in range(FLAG_WORDS, len(words)):
            value = int(words[w])
            while value:
                low = value & -value
                bits.append((w - FLAG_WORDS) * 64 + low.bit_length() - 1)
                value ^= low
        return [b for b in bits if b in self._by_bit]
