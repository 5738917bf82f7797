"""The fixed-point arithmetic written plainly (a separate scale, round and convert; ldexp for any
exponent): the reference the optimised encoder, decoder and ring loops must equal bit for bit."""
import numpy as np

from mpifgl.ring import SIGNED


def reference_encode(values: np.ndarray, exponent: int, ring: np.dtype) -> np.ndarray:
    float_type = np.float32 if ring == np.uint32 else np.float64
    scaled = np.ldexp(np.asarray(values, dtype=float_type), exponent)
    return np.rint(scaled).astype(SIGNED[np.dtype(ring)]).view(ring)


def reference_decode(words: np.ndarray, exponent: int, dtype) -> np.ndarray:
    return np.ldexp(words.view(SIGNED[words.dtype]).astype(dtype), -exponent)
