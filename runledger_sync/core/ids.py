"""UUIDv7 ids, generated in Python because PostgreSQL before 18 has no uuidv7()."""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID

_lock = threading.Lock()
_last_ms = 0
_sequence = 0
_SEQUENCE_MAX = (1 << 12) - 1


def uuid7() -> UUID:
    """Return a new RFC 9562 version-7 UUID: 48-bit Unix milliseconds, a sequence, random bits.

    Ids from one process increase strictly (the 12-bit ``rand_a`` field counts
    within a millisecond, RFC 9562 method 1), so jobs enqueued in one batch keep
    their order when the claim breaks ties by id.
    """
    return UUID(int=_uuid7_values(1)[0])


def uuid7_strings(count: int) -> list[str]:
    """``count`` new version-7 UUIDs in their text form, for ids sent straight to the database.

    One lock and one read of the random source for all of them, and no UUID
    objects: the claim draws an attempt id for every job it may lease.
    """
    strings = []
    for value in _uuid7_values(count):
        digits = f"{value:032x}"
        strings.append(f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}")
    return strings


def _uuid7_values(count: int) -> list[int]:
    global _last_ms, _sequence
    sequences = []
    with _lock:
        for _ in range(count):
            unix_ms = time.time_ns() // 1_000_000
            if unix_ms <= _last_ms:
                unix_ms = _last_ms
                _sequence += 1
                if _sequence > _SEQUENCE_MAX:
                    unix_ms += 1
                    _sequence = 0
            else:
                _sequence = 0
            _last_ms = unix_ms
            sequences.append((unix_ms, _sequence))
    random = os.urandom(8 * count)
    values = []
    for index, (unix_ms, sequence) in enumerate(sequences):
        rand_b = int.from_bytes(random[8 * index:8 * index + 8], "big") & ((1 << 62) - 1)
        value = (unix_ms & ((1 << 48) - 1)) << 80
        value |= 0x7 << 76 | sequence << 64
        value |= 0b10 << 62 | rand_b
        values.append(value)
    return values
