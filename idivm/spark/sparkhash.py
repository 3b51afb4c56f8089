"""Spark's ``pmod(xxhash64(col), n)`` computed in Python, for the bucket of a stored row.

Caches and views are partitioned by ``__idivm_bucket = pmod(xxhash64(id), N)``
(``idivm.spark.delta``). A refresh run on the driver (``idivm.spark.driver``) must put an inserted
row in the bucket Spark would, or a later refresh run by Spark would look for it elsewhere. Spark's
``XXH64`` (``org.apache.spark.sql.catalyst.expressions.XXH64``, seed 42) is the standard XXH64 of
the value's bytes: an int (also date, short, byte, boolean as 0/1, a float's bits) as 4
little-endian bytes, a long (also timestamp micros, a double's bits, a decimal of precision ≤ 18
as its unscaled long) as 8, a string as its UTF-8 bytes; NULL hashes to the seed. Types outside
that list return None from ``bucket_function`` (the driver then leaves the refresh to Spark).
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from collections.abc import Callable
from typing import Any

SEED = 42
_M = (1 << 64) - 1
P1 = 0x9E3779B185EBCA87
P2 = 0xC2B2AE3D27D4EB4F
P3 = 0x165667B19E3779F9
P4 = 0x85EBCA77C2B2AE63
P5 = 0x27D4EB2F165667C5
_EPOCH = _dt.date(1970, 1, 1)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * P2) & _M
    return (_rotl(acc, 31) * P1) & _M


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * P1 + P4) & _M


def _fmix(h: int) -> int:
    h ^= h >> 33
    h = (h * P2) & _M
    h ^= h >> 29
    h = (h * P3) & _M
    h ^= h >> 32
    return h


def xxh64(data: bytes, seed: int = SEED) -> int:
    """XXH64 of ``data`` as an unsigned 64-bit integer."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + P1 + P2) & _M
        v2 = (seed + P2) & _M
        v3 = seed & _M
        v4 = (seed - P1) & _M
        while i + 32 <= n:
            a, b, cc, d = struct.unpack_from("<4Q", data, i)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, cc), _round(v4, d)
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * P1 + P4) & _M
        i += 8
    if i + 4 <= n:
        (k,) = struct.unpack_from("<I", data, i)
        h ^= (k * P1) & _M
        h = (_rotl(h, 23) * P2 + P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * P5) & _M
        h = (_rotl(h, 11) * P1) & _M
        i += 1
    return _fmix(h)


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def _int4(v: int) -> bytes:
    return struct.pack("<i", v)


def _int8(v: int) -> bytes:
    return struct.pack("<q", v)


def _double(v: float) -> bytes:
    if v == 0.0:
        v = 0.0  # Spark normalizes -0.0
    if math.isnan(v):
        return _int8(0x7FF8000000000000)
    return struct.pack("<d", v)


def _float(v: float) -> bytes:
    if v == 0.0:
        v = 0.0
    if math.isnan(v):
        return _int4(0x7FC00000)
    return struct.pack("<f", v)


def _micros(v: _dt.datetime) -> bytes:
    if v.tzinfo is None:
        v = v.replace(tzinfo=_dt.UTC)
    delta = v - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
    return _int8((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def bucket_function(arrow_type: Any) -> Callable[[Any], bytes] | None:
    """The bytes Spark hashes for a value of this Arrow type, or None when not covered."""
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return _int4
    if pa.types.is_int64(t):
        return _int8
    if pa.types.is_boolean(t):
        return lambda v: _int4(1 if v else 0)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return lambda v: v.encode("utf-8")
    if pa.types.is_date32(t):
        return lambda v: _int4((v - _EPOCH).days)
    if pa.types.is_float64(t):
        return _double
    if pa.types.is_float32(t):
        return _float
    if pa.types.is_timestamp(t) and t.unit == "us":
        return _micros
    if pa.types.is_decimal(t) and t.precision <= 18:
        scale = t.scale
        return lambda v: _int8(int(v.scaleb(scale)))
    return None


def buckets(values: Any, n: int) -> list[int] | None:
    """``pmod(xxhash64(v), n)`` for each value of an Arrow array, as Spark computes it; None
    when the array's type is not covered."""
    as_bytes = bucket_function(values.type)
    if as_bytes is None:
        return None
    null_bucket = _signed(SEED) % n  # xxhash64(NULL) is the seed
    return [null_bucket if v is None else _signed(xxh64(as_bytes(v))) % n
            for v in values.to_pylist()]
