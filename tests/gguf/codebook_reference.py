#!/usr/bin/python3
"""Independent decoders of the ggml block types MXFP4, IQ4_NL and IQ4_XS, written from their
specifications rather than from ggml's code (tests/gguf/quants_iq_test.cc compares arbor's
decoder with these and with llama.cpp's own).

  codebook_reference.py TYPE IN.bin OUT.f32

TYPE is mxfp4, iq4_nl or iq4_xs; IN.bin whole blocks of that type; OUT.f32 the decoded values,
float32 little-endian.

* MXFP4 (OCP Microscaling Formats v1.0, section 5.3 "MXFP4"): a block of 32 is one E8M0 shared
  scale X (an unsigned exponent, X = 2^(e - 127)) and 32 FP4 E2M1 elements (1 sign bit, 2
  exponent bits with bias 1, 1 mantissa bit: subnormal 0.5 * m when the exponent is 0, else
  2^(exp - 1) * (1 + m / 2)). ggml's layout: byte 0 is e, then 16 bytes whose low nibbles are
  elements 0..15 and high nibbles elements 16..31. The value is X * element, rounded once to
  float32 (exact: a power of two times 1 or 1.5, overflowing to inf for e = 255 with 6.0).
  E8M0 0xFF is NaN in the OCP spec; ggml (and so every GGUF reader) decodes it as 2^128, which
  this decoder follows. The spec's -0 (sign bit, zero magnitude) is returned as -0.0 here; the
  test accepts ggml's +0.0 for it (equal values).
* IQ4_NL: blocks of 32: an fp16 scale d and 16 bytes of 4-bit indices (low nibbles elements
  0..15, high nibbles 16..31) into the non-linear table below; value = d * table[index], in
  float32.
* IQ4_XS: super-blocks of 256: fp16 d, a u16 of 8 two-bit high scale parts, 4 bytes of 8
  four-bit low scale parts, 128 bytes of indices (16 per block of 32, as IQ4_NL). Block j's
  scale is (low_j | high_j << 4) - 32 (six bits, offset 32); value = (d * scale) * table[idx].
"""
import sys

import numpy as np

IQ4_TABLE = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                     dtype=np.float32)


def e2m1(nibbles):
    sign = np.where(nibbles & 8, -1.0, 1.0)
    exp = (nibbles >> 1) & 3
    man = (nibbles & 1).astype(np.float64)
    mag = np.where(exp == 0, 0.5 * man, np.ldexp(1.0 + man / 2, exp.astype(np.int32) - 1))
    return sign * mag


def split_nibbles(qs):
    """[n, 16] bytes -> [n, 32] indices: low nibbles first, then high nibbles."""
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def decode_mxfp4(raw):
    blocks = raw.reshape(-1, 17)
    e = blocks[:, 0].astype(np.int32)
    elements = e2m1(split_nibbles(blocks[:, 1:]))
    return (elements * np.ldexp(1.0, e - 127)[:, None]).astype(np.float32)


def decode_iq4_nl(raw):
    blocks = raw.reshape(-1, 18)
    d = blocks[:, 0:2].copy().view('<f2').astype(np.float32)
    return d * IQ4_TABLE[split_nibbles(blocks[:, 2:])]


def decode_iq4_xs(raw):
    blocks = raw.reshape(-1, 136)
    d = blocks[:, 0:2].copy().view('<f2').astype(np.float32)[:, 0]
    scales_h = blocks[:, 2:4].copy().view('<u2')[:, 0].astype(np.int32)
    scales_l = blocks[:, 4:8].astype(np.int32)
    out = np.empty((blocks.shape[0], 256), dtype=np.float32)
    for j in range(8):
        low = (scales_l[:, j // 2] >> (4 * (j % 2))) & 15
        high = (scales_h >> (2 * j)) & 3
        scale = (d * ((low | high << 4) - 32).astype(np.float32)).astype(np.float32)
        idx = split_nibbles(blocks[:, 8 + 16 * j:8 + 16 * (j + 1)])
        out[:, 32 * j:32 * (j + 1)] = scale[:, None] * IQ4_TABLE[idx]
    return out


def main():
    kind, src, dst = sys.argv[1:4]
    raw = np.fromfile(src, dtype=np.uint8)
    decode = {'mxfp4': decode_mxfp4, 'iq4_nl': decode_iq4_nl, 'iq4_xs': decode_iq4_xs}[kind]
    with np.errstate(over='ignore'):
        decode(raw).astype('<f4').tofile(dst)


if __name__ == '__main__':
    main()
