"""``--secure``'s keys: the per-run key agreement and the keystreams. The keys live only in
these objects: never pickled, logged or written (tests check the run's files).

Key set-up, once per run (``RunKeys.agree``, collective): every client draws an X25519 key pair
in memory; the server relays the public keys and a fresh random salt; each pair of clients
derives, with HKDF-SHA256 of their shared secret, one key per direction for the exchange (i -> j
and j -> i differ: the X25519 secret is symmetric) and one pair key for the zero-sum masks.

Keystreams: AES-128-CTR, one stream per key for the whole run (``KeyStream``: a new nonce every
SEGMENT_BYTES, made by OpenSSL's AES-GCM code), read front to back: each masked operation takes
the stream's next bytes. Every rank runs the same operations in the same order, so a stream's
two holders (sender and owner, or a pair's two clients) read the same bytes for the same words,
and no byte masks twice; keys are fresh every run (a resume agrees new ones).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mpifgl.communicator import Communicator

# AES-128: the 128-bit security level of the X25519 agreement the keys come from
KEY_BYTES = 16
SALT_BYTES = 32
# bytes of a key stream per nonce: below GCM's 2^32 counter blocks (and cryptography's byte cap
# for one GCM nonce), so no counter block repeats
SEGMENT_BYTES = 2 ** 35


_ZEROS = [memoryview(bytes(0))]


def _zeros(length: int) -> memoryview:
    """``length`` zero bytes, from one buffer kept across calls (the keystream's plaintext)."""
    if len(_ZEROS[0]) < length:
        _ZEROS[0] = memoryview(bytes(max(length, 2 * len(_ZEROS[0]))))
    return _ZEROS[0][:length]


def _derive(secret: bytes, salt: bytes, label: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt,
                info=label.encode()).derive(secret)


@dataclass
class KeystreamUse:
    """One read of a key's stream: which key (by its label, never the key), by which role, and
    the bytes [start, end) of the stream it took."""

    key_label: tuple
    role: str  # mask / unmask (exchange), add / subtract (zero-sum)
    start: int
    end: int


class KeyStream:
    """One key's AES-128-CTR keystream for the whole run, read front to back: every byte once.
    Its two holders (sender and owner, or a pair's adding and subtracting client) read it in the
    same order and amounts, because every rank runs the same masked operations in the same order
    on the same plans; so the same bytes mask and unmask, and no byte masks twice.

    Segment s of SEGMENT_BYTES is AES-CTR from counter block nonce(s) || 2 with a 32-bit block
    counter, nonce(s) = s in 12 big-endian bytes: exactly what AES-GCM encrypts a plaintext with,
    so OpenSSL's GCM code makes it (its wide-vector AES path is faster than its CTR path on
    current x86 CPUs; docs/privacy.md); the encryption of zeros is the keystream, and no tag is
    made."""

    def __init__(self, key: bytes, label: tuple):
        if len(key) != KEY_BYTES:
            raise ValueError(f"a {len(key)}-byte stream key, expected {KEY_BYTES} (AES-128)")
        self.key = key
        self.label = label
        self.position = 0  # bytes read so far
        self._segment = -1
        self._encryptor = None

    def __repr__(self) -> str:  # keys must never reach a log line
        return f"KeyStream({self.label}, at byte {self.position})"

    def read_into(self, out: np.ndarray, role: str, log: list[KeystreamUse] | None) -> None:
        """Fill the contiguous array ``out`` with the stream's next ``out.nbytes`` bytes."""
        count = out.nbytes
        if log is not None:
            log.append(KeystreamUse(self.label, role, self.position, self.position + count))
        buffer, done = out.reshape(-1).view(np.uint8), 0
        while done < count:
            segment, offset = divmod(self.position, SEGMENT_BYTES)
            if segment != self._segment:  # reads are sequential: the segment's first byte
                nonce = segment.to_bytes(12, "big")
                self._encryptor = Cipher(algorithms.AES(self.key), modes.GCM(nonce)).encryptor()
                self._segment = segment
            take = min(count - done, SEGMENT_BYTES - offset)
            # the encryption of zeros: the keystream itself
            self._encryptor.update_into(_zeros(take), buffer[done:done + take])
            done += take
            self.position += take


class RunKeys:
    """One client's key streams for a run (the server holds none): to each owner j (k_{me->j}),
    from each sender i (k_{i->me}), and per pair (k_{me,j}, the zero-sum masks)."""

    def __init__(self, client_id: int, exchange_to: dict[int, bytes],
                 exchange_from: dict[int, bytes], pair: dict[int, bytes]):
        self.to = {j: KeyStream(key, ("exchange", client_id, j))
                   for j, key in sorted(exchange_to.items())}
        self.from_ = {i: KeyStream(key, ("exchange", i, client_id))
                      for i, key in sorted(exchange_from.items())}
        self.pair = {j: KeyStream(key, ("zero-sum",) + tuple(sorted((client_id, j))))
                     for j, key in sorted(pair.items())}

    def __repr__(self) -> str:  # keys must never reach a log line
        return f"RunKeys({len(self.to)} owners, {len(self.from_)} senders, {len(self.pair)} pairs)"

    def __reduce__(self):
        raise TypeError("a run's keys are never pickled")

    @classmethod
    def agree(cls, comm: Communicator) -> "RunKeys":
        """Collective: fresh X25519 keys per client, public keys and a salt relayed by the
        server, HKDF-derived keys per direction and per pair."""
        client_id = comm.rank - 1
        private = None if comm.is_server else X25519PrivateKey.generate()
        public = None if private is None else private.public_key().public_bytes_raw()
        publics = comm.gather_objects(public)
        relayed = (publics[1:], os.urandom(SALT_BYTES)) if comm.is_server else None
        public_keys, salt = comm.broadcast_object(relayed)
        exchange_to, exchange_from, pair = {}, {}, {}
        if private is not None:
            if public_keys[client_id] != public:
                raise ValueError(f"--secure: the server relayed another public key for client "
                                 f"{client_id} than the one it sent")
            for j, other in enumerate(public_keys):
                if j == client_id:
                    continue
                secret = private.exchange(X25519PublicKey.from_public_bytes(other))
                exchange_to[j] = _derive(secret, salt, f"mpifgl exchange {client_id}->{j}")
                exchange_from[j] = _derive(secret, salt, f"mpifgl exchange {j}->{client_id}")
                low, high = sorted((client_id, j))
                pair[j] = _derive(secret, salt, f"mpifgl zero-sum {low}-{high}")
        return cls(client_id, exchange_to, exchange_from, pair)
