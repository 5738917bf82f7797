"""--secure's keys for tests: streams by their definition, fixed keys, and what a session holds."""
from __future__ import annotations

import hashlib

import numpy as np

from mpifgl.keys import KEY_BYTES, SEGMENT_BYTES, RunKeys
from mpifgl.secure import SecureSession


def aes_ctr_stream(key: bytes, count: int, segment_bytes: int = SEGMENT_BYTES) -> np.ndarray:
    """``count`` bytes of a key stream by its definition: AES-128-CTR, segment s from counter
    block (s as 12 big-endian bytes) || 2, a new segment every ``segment_bytes``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    pieces = []
    for segment in range(-(-count // segment_bytes)):
        block = segment.to_bytes(12, "big") + (2).to_bytes(4, "big")
        size = min(segment_bytes, count - segment * segment_bytes)
        pieces.append(Cipher(algorithms.AES(key), modes.CTR(block)).encryptor()
                      .update(bytes(size)))
    return np.frombuffer(b"".join(pieces), dtype=np.uint8)


def reference_keystream(key: bytes, byte_offset: int, count: int, ring: np.dtype) -> np.ndarray:
    """``count`` ring words of the key's AES-128-CTR stream from ``byte_offset`` on."""
    stream = aes_ctr_stream(key, byte_offset + count * ring.itemsize)
    return stream[byte_offset:].view(ring)


def fixed_key(label: str) -> bytes:
    return hashlib.sha256(f"test key {label}".encode()).digest()[:KEY_BYTES]


def fixed_session(comm) -> SecureSession:
    """SecureSession.agree's keys, but fixed (the same in the run and in the reference)."""
    me, m = comm.rank - 1, comm.size - 1
    others = [] if comm.is_server else [j for j in range(m) if j != me]
    return SecureSession(me, m, RunKeys(
        me, {j: fixed_key(f"{me}->{j}") for j in others},
        {j: fixed_key(f"{j}->{me}") for j in others},
        {j: fixed_key(f"{min(me, j)}-{max(me, j)}") for j in others}))


def keys_of(session: SecureSession) -> list[bytes]:
    """Every key a session holds (to look for them in a run's files)."""
    keys = session.keys
    return [s.key for streams in (keys.to, keys.from_, keys.pair) for s in streams.values()]
