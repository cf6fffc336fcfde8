"""Kafka's partitioner: murmur2 of the key for keyed records, sticky partitions for the rest.

:func:`murmur2` is a port of Kafka's ``Utils.murmur2`` (seed ``0x9747b28c``; Java's ``>>>`` is
an unsigned shift, so 32-bit unsigned arithmetic gives the same bits), and
:func:`partition_for_key` is ``Utils.toPositive(murmur2(key)) % numPartitions``, so a key lands
on the same partition as with Kafka's Java producer. :func:`murmur2_arrow` computes the same
hash for a whole Arrow column with Arrow compute kernels (no per-row Python).

Unkeyed records use the sticky partitioner of KIP-480: they stick to one partition until its
batch is full or sent, then switch to another (random) partition; see the accumulator.
"""

from __future__ import annotations

import struct
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "SEED",
    "KeyHashCache",
    "murmur2",
    "murmur2_arrow",
    "partition_for_key",
    "partitions_for_keys",
]

SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_R: Final = 24
_MASK32: Final = 0xFFFFFFFF


#: Unpackers of n little-endian uint32 words, for keys up to 256 bytes.
_WORDS: Final = [struct.Struct(f"<{n}I") for n in range(65)]


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int (Java's ``int``)."""
    length = len(data)
    h = SEED ^ length
    n4 = length >> 2
    if n4:
        words = _WORDS[n4].unpack_from(data) if n4 <= 64 else struct.unpack_from(f"<{n4}I", data)
        for k in words:
            k = (k * _M) & _MASK32
            k = ((k ^ (k >> _R)) * _M) & _MASK32
            h = ((h * _M) & _MASK32) ^ k
    rest = length & 3
    if rest:
        tail = length & ~3
        if rest == 3:
            h ^= data[tail + 2] << 16
        if rest >= 2:
            h ^= data[tail + 1] << 8
        h = ((h ^ data[tail]) * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """``toPositive(murmur2(key)) % num_partitions``, as Kafka's default partitioner."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class KeyHashCache:
    """``toPositive(murmur2(key))`` of recently seen keys (keys repeat: user ids, ...).

    Bounded: cleared when it holds ``size`` keys, so unique keys cost one dict insert each.
    """

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self._hashes: dict[bytes, int] = {}

    def partition(self, key: bytes, num_partitions: int) -> int:
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= self.size:
                self._hashes.clear()
            h = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return h % num_partitions


def _u32(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.uint32())


def murmur2_arrow(keys: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Kafka's murmur2 of every key of a binary (or string) column, as uint32 (unsigned bits).

    Null keys hash as empty keys; mask them out where it matters. Runs in Arrow kernels: the
    loop is over 4-byte blocks of the longest key, not over rows.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if not pa.types.is_binary(keys.type):
        keys = keys.cast(pa.binary())
    n = len(keys)
    if n == 0:
        return pa.array([], pa.uint32())
    keys = keys.fill_null(b"")
    # Raw bytes of the column and where each key starts, without copying.
    offsets = pa.Array.from_buffers(
        pa.int32(), n + 1, [None, keys.buffers()[1]], offset=keys.offset
    )
    data_buffer = keys.buffers()[2]
    data = pa.Array.from_buffers(
        pa.uint8(), 0 if data_buffer is None else data_buffer.size, [None, data_buffer]
    )
    starts = offsets.slice(0, n).cast(pa.int64())
    lengths = pc.binary_length(keys).cast(pa.int64())
    m = _u32(_M)

    def byte_at(index: pa.Array, valid: pa.Array) -> pa.Array:
        safe = pc.if_else(valid, index, pa.scalar(0, pa.int64()))
        if len(data) == 0:
            return pa.repeat(_u32(0), n)
        return pc.if_else(valid, pc.take(data, safe).cast(pa.uint32()), _u32(0))

    h = pc.bit_wise_xor(lengths.cast(pa.uint32()), _u32(SEED))
    blocks = pc.shift_right(lengths, pa.scalar(2, pa.int64()))
    max_blocks = pc.max(blocks).as_py() or 0
    for i in range(max_blocks):
        valid = pc.greater(blocks, pa.scalar(i, pa.int64()))
        base = pc.add(starts, pa.scalar(4 * i, pa.int64()))
        k = byte_at(base, valid)
        for j in (1, 2, 3):
            b = byte_at(pc.add(base, pa.scalar(j, pa.int64())), valid)
            k = pc.bit_wise_or(k, pc.shift_left(b, _u32(8 * j)))
        k = pc.multiply(k, m)
        k = pc.bit_wise_xor(k, pc.shift_right(k, _u32(_R)))
        k = pc.multiply(k, m)
        mixed = pc.bit_wise_xor(pc.multiply(h, m), k)
        h = pc.if_else(valid, mixed, h)
    rest = pc.bit_wise_and(lengths, pa.scalar(3, pa.int64()))
    tail = pc.add(starts, pc.multiply(blocks, pa.scalar(4, pa.int64())))
    for j, shift in ((2, 16), (1, 8), (0, 0)):
        valid = pc.greater(rest, pa.scalar(j, pa.int64()))
        b = byte_at(pc.add(tail, pa.scalar(j, pa.int64())), valid)
        h = pc.bit_wise_xor(h, pc.shift_left(b, _u32(shift)))
    h = pc.if_else(pc.greater(rest, pa.scalar(0, pa.int64())), pc.multiply(h, m), h)
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(13)))
    h = pc.multiply(h, m)
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(15)))
    return h


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, num_partitions: int) -> pa.Array:
    """``toPositive(murmur2(key)) % num_partitions`` for a whole column, as int32."""
    h = pc.bit_wise_and(murmur2_arrow(keys), _u32(0x7FFFFFFF))
    return _mod(h.cast(pa.int64()), num_partitions).cast(pa.int32())


def _mod(values: pa.Array, divisor: int) -> pa.Array:
    """Non-negative ``values % divisor`` (Arrow has no modulo kernel)."""
    quotient = pc.divide(values, pa.scalar(divisor, pa.int64()))  # integer division truncates
    return pc.subtract(values, pc.multiply(quotient, pa.scalar(divisor, pa.int64())))
