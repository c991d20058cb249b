"""Counter-based random numbers for masking (masking.generator = "counter").

Every draw is a pure function of (row key, stream, counter), computed with int64 torch ops on the device
the rows live on; nothing is sequential and no generator state exists:

- row key: SplitMix64's mixer absorbed over the row's key parts, h <- mix64((h ^ part) + GOLDEN) from
  h = DOMAIN; the parts are (run seed, global instance index, epoch) for training rows.
- draw n of a row: mix64(key + n * GOLDEN), i.e. the n-th output of a SplitMix64 generator seeded with the
  key, with n = stream * 2**24 + counter (counter: a position, a word, a unit or a span round). Streams
  never overlap for rows under 2**24 positions.
- uniform: the top 53 bits * 2**-53 (exact in float64); below(n): the top 63 bits mod n (bias < n / 2**63).

torch int64 addition and multiplication wrap modulo 2**64 on every device, but `>>` on int64 is an
arithmetic shift: a logical shift is the shift followed by a mask (`_lsr`). So the same call gives bitwise
the same bits on CPU and CUDA; tests/test_masking.py checks them against a pure-Python uint64 reference,
tests/test_cuda.py CPU against CUDA.
"""

from __future__ import annotations

import torch

M64 = (1 << 64) - 1


def _signed(c: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return c - (1 << 64) if c >= 1 << 63 else c


GOLDEN = _signed(0x9E3779B97F4A7C15)
C1 = _signed(0xBF58476D1CE4E5B9)
C2 = _signed(0x94D049BB133111EB)
DOMAIN = _signed(0x6D61736B696E6721)  # "masking!": the start of every row key
COUNTER_BITS = 24

# streams: one per use, so no two uses of a row ever read the same draw
SCORE, SPLIT, REPLACE, WORD_KEY, WORD_COIN, ROUND, SPAN, SPAN_BUDGET = range(1, 9)


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> on int64 copies the sign bit)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function (Stafford's Mix13), elementwise on int64 tensors."""
    z = z ^ _lsr(z, 30)
    z = z * C1
    z ^= _lsr(z, 27)
    z *= C2
    z ^= _lsr(z, 31)
    return z


def row_keys(parts: torch.Tensor) -> torch.Tensor:
    """[B, K] int64 key parts -> [B] row keys, on parts' device."""
    h = torch.full(parts.shape[:1], DOMAIN, dtype=torch.int64, device=parts.device)
    for j in range(parts.shape[1]):
        h = mix64((h ^ parts[:, j]) + GOLDEN)
    return h


def bits(keys: torch.Tensor, stream: int, counters: torch.Tensor) -> torch.Tensor:
    """[B] keys x [C] (or [B, C]) counters -> [B, C] random int64 bits of that stream."""
    n = (counters + (stream << COUNTER_BITS)) * GOLDEN
    return mix64(keys.unsqueeze(1) + n)


def uniform(b: torch.Tensor) -> torch.Tensor:
    """Random bits -> float64 uniforms in [0, 1), multiples of 2**-53."""
    return _lsr(b, 11).double() * (2.0**-53)


def below(b: torch.Tensor, n: int) -> torch.Tensor:
    """Random bits -> int64 in [0, n)."""
    return _lsr(b, 1) % n


class CounterDraws:
    """The draws masking reads for rows with these keys, made on demand: uniforms [B, L] of a stream,
    the stochastic-rounding coin [B] and random-replacement indices [B, L]."""

    def __init__(self, keys: torch.Tensor, L: int):
        self.keys, self.L = keys, L
        self.positions = torch.arange(L, dtype=torch.int64, device=keys.device)
        self._u: dict[int, torch.Tensor] = {}

    def u(self, stream: int) -> torch.Tensor:
        if stream not in self._u:
            self._u[stream] = uniform(bits(self.keys, stream, self.positions))
        return self._u[stream]

    def coin(self) -> torch.Tensor:
        return uniform(bits(self.keys, ROUND, self.positions[:1])).squeeze(1)

    def replace(self, n: int) -> torch.Tensor:
        return below(bits(self.keys, REPLACE, self.positions), n)
