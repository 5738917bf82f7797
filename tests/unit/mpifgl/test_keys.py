"""mpifgl.keys: a key's stream is AES-128-CTR by its definition, read across any read sizes and
segment boundaries; keys are never pickled or printed (the key agreement runs in
test_secure.py's whole-run test)."""
from __future__ import annotations

import numpy as np
import pytest

from mpifgl import keys
from mpifgl.keys import KEY_BYTES, KeyStream, RunKeys
from mpifgl.secure import SecureSession
from tests.helpers.keys import aes_ctr_stream


def test_a_key_stream_continues_across_reads_and_keys_differ():
    """Reads of any sizes, end to end, are one AES-128-CTR keystream of the key (so a chunked
    exchange masks each row with the bytes of its position); another key gives another stream;
    the log records byte ranges, never the key."""
    key = b"k" * KEY_BYTES
    whole = aes_ctr_stream(key, 8000)
    stream, log = KeyStream(key, ("exchange", 0, 1)), []
    parts = [np.empty(n, dtype=np.uint32) for n in (1, 3, 250, 1, 745)]
    for part in parts:
        stream.read_into(part, "mask", log)
    np.testing.assert_array_equal(np.concatenate(parts).view(np.uint8), whole[:4000])
    words = np.empty((500, 1), dtype=np.uint64)
    stream.read_into(words, "mask", log)
    np.testing.assert_array_equal(words.view(np.uint8).ravel(), whole[4000:8000])
    assert [(u.start, u.end) for u in log][-2:] == [(1020, 4000), (4000, 8000)]
    assert all("k" * 8 not in repr(u) for u in log) and "k" * 8 not in repr(stream)
    other = np.empty(1000, dtype=np.uint32)
    KeyStream(b"j" * KEY_BYTES, ()).read_into(other, "mask", None)
    assert np.mean(other == np.concatenate(parts)) < 0.01
    with pytest.raises(ValueError, match="a 32-byte stream key, expected 16"):
        KeyStream(b"k" * 32, ())


def test_a_key_stream_takes_a_new_nonce_every_segment(monkeypatch):
    """Past SEGMENT_BYTES a stream goes on under the next nonce (no counter block of a nonce is
    used twice), also when one read spans several segments."""
    monkeypatch.setattr(keys, "SEGMENT_BYTES", 48)
    key = b"s" * KEY_BYTES
    stream, parts = KeyStream(key, ()), []
    for words in (5, 7, 40, 1, 3):  # 4-byte words: reads across 0, 1 and several boundaries
        parts.append(np.empty(words, dtype=np.uint32))
        stream.read_into(parts[-1], "mask", None)
    got = np.concatenate(parts).view(np.uint8)
    np.testing.assert_array_equal(got, aes_ctr_stream(key, got.size, segment_bytes=48))
    assert not np.array_equal(got[:48], got[48:96])


def test_keys_and_a_session_refuse_to_be_pickled_or_printed():
    import pickle
    run_keys = RunKeys(0, {1: b"k" * 16}, {1: b"l" * 16}, {1: b"m" * 16})
    session = SecureSession(0, 2, run_keys)
    for holder in (run_keys, session):
        with pytest.raises(TypeError, match="never pickled"):
            pickle.dumps(holder)
        assert "k" * 8 not in repr(holder)
