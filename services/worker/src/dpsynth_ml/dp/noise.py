"""The Gaussian noise of DP-SGD, drawn from a ChaCha20 keystream on the parameters' device.

Why not ``torch.normal``: its generator (Mersenne Twister on the CPU, Philox on CUDA) is not
a cryptographic generator, and the Gaussian it returns is a deterministic function of a few
53-bit uniforms. Floating-point attacks (Mironov 2012, "On significance of the least
significant bits for differential privacy"; Jin et al. 2022, arXiv:2112.05307, which broke
opacus' noise) read which of the sampler's finitely many outputs a released value can be,
and so which neighbouring input it came from. opacus' defence (``secure_mode``, after
Holohan & Braghin 2021, arXiv:2107.10138, §5.1) needs two things: a cryptographically
secure generator (``torchcsprng``, unmaintained since 2021, does not install with torch
2.13) and each released Gaussian being a sum of 2n Gaussians (n = 2), so inverting the
output costs about 2^(53 (2n - 1)) instead of 2^53.

This module provides both, in plain torch integer ops that run unchanged on CPU and CUDA:

* Keystream: the ChaCha20 block function of RFC 8439 §2.3 (20 rounds, 256-bit key, 32-bit
  block counter, 96-bit nonce). Two implementations of the same function, chosen per device
  (:func:`keystream_backend`), whose bytes are identical (tested for random keys, nonces and
  counters):

  - ``torch`` (GPUs, and any device without the other): vectorised over blocks in int32
    words (torch.uint32 lacks most kernels): additions wrap modulo 2^32 and right shifts are
    masked (they are arithmetic on signed ints). Wraparound is what every torch backend
    computes but not a documented guarantee.
  - ``openssl`` (the CPU of a little-endian host): OpenSSL's ChaCha20 through the
    ``cryptography`` package (already a dependency of ``dpsynth_shared``), i.e. the SIMD
    assembly every TLS connection uses, encrypting zeros into a reused buffer. With the
    torch kernels the keystream was about 2/3 of a CPU noise draw; with OpenSSL a full-UNet
    draw fell from 485 to 134 ms at one thread (``benchmarks/noise_cost.py``).

  Each (device, implementation) runs the RFC's known-answer block before its first draw
  (:func:`check_keystream`) and refuses to draw noise if it differs.
* Key: 256 bits from the OS (``secrets``) per :class:`ChaChaGaussian`, i.e. per engine, i.e.
  per attempt (docs/privacy.md: noise is never replayed on resume).
* Nonce and counter: the n-th call to :meth:`ChaChaGaussian.gaussian` uses nonce
  ``n`` (96 bits, little-endian) and block counters 0, 1, ... within the call, so no
  (key, nonce, counter) block is ever used twice by one source (RFC 8439 §2.3: a nonce must
  never repeat for a key). A test source takes a new key for every call instead (nonce 0).
* Uniforms: 64 keystream bits per uniform (8 bytes as a little-endian integer), the top 53
  kept, ``(k + 1) * 2^-53`` in (0, 1] (never 0, so ``log`` is finite); exact in float64.
* Gaussians: Box–Muller in float64 (both outputs used), then opacus' secure-mode sum
  (``opacus.optimizers.optimizer._generate_noise``, opacus 1.6): four N(0, std^2) draws
  summed and divided by 2, which is N(0, std^2). opacus' additional throw-away draw
  (``torch.normal(size=(1, 1))`` before the sum) only moves a stateful torch generator's
  position; a counter-mode stream with a fresh key has no position to hide, so it is not
  mirrored. The result is cast to the parameter's dtype last.

Test injection (docs/privacy.md, "The noise source"): :meth:`ChaChaGaussian.keyed_by`
draws each call's key from a seeded ``torch.Generator`` given by a test, so tests exercise
the same keystream and Gaussian code, and replaying the generator replays the noise (as it
did with ``torch.normal``); a model trained that way is stamped ``rng: test`` by
:func:`dpsynth_ml.train`. See docs/privacy.md for the residual risks.
"""

from __future__ import annotations

import math
import secrets
import sys
from typing import Literal, Protocol

import torch

NoiseKind = Literal["os", "test"]
#: Which implementation of the ChaCha20 block function computes a keystream.
KeystreamBackend = Literal["torch", "openssl"]

_MASK32 = 0xFFFFFFFF
# "expand 32-byte k" as four little-endian words (RFC 8439 §2.3)
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
_KEY_BYTES, _NONCE_BYTES = 32, 12
_WORDS_PER_OUTPUT = 8  # 4 Gaussians per output value, one 64-bit uniform (2 words) each
# RFC 8439 §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1
_KAT_NONCE = bytes.fromhex("000000090000004a00000000")
_KAT_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")
_checked_devices: set[tuple[torch.device, KeystreamBackend]] = set()


class NoiseSource(Protocol):
    """Where DP-SGD's Gaussian noise comes from (one instance per engine, i.e. attempt)."""

    kind: NoiseKind

    def gaussian(self, shape: torch.Size | tuple[int, ...], std: float, *,
                 device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Independent N(0, std^2) values of ``shape``, on ``device``, in ``dtype``."""
        ...


def _words_le(data: bytes) -> list[int]:
    """Little-endian 32-bit words of ``data`` (RFC 8439 §2.3: key and nonce layout)."""
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]


def _rotl(x: torch.Tensor, bits: int) -> torch.Tensor:
    """In-place 32-bit left rotation of int32 words (two's complement).

    torch's left shift of a signed int is done on its unsigned bit pattern; its right shift
    is arithmetic, so the bits brought in from the left are masked off.
    """
    high = (x >> (32 - bits)).bitwise_and_((1 << bits) - 1)
    return x.bitwise_left_shift_(bits).bitwise_or_(high)


def _quarter_round(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   d: torch.Tensor) -> None:
    """RFC 8439 §2.1 quarter round, in place, on rows of int32 words (each a [4, B] tensor).

    Additions are modulo 2^32 by int32 wraparound, which every torch backend computes (the
    vectorised kernels use wrapping integer instructions); it is not a documented torch
    guarantee, so :func:`check_keystream` runs the RFC's known-answer block on each device
    before its first draw, and the tests compare the keystream with a second library.
    """
    a.add_(b)
    _rotl(d.bitwise_xor_(a), 16)
    c.add_(d)
    _rotl(b.bitwise_xor_(c), 12)
    a.add_(b)
    _rotl(d.bitwise_xor_(a), 8)
    c.add_(d)
    _rotl(b.bitwise_xor_(c), 7)


def _int32_words(values: list[int], device: torch.device) -> torch.Tensor:
    """32-bit words (in [0, 2^32)) as int32 with the same bit pattern."""
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values],
                        dtype=torch.int32, device=device)


def chacha20_blocks(key: bytes, nonce: bytes, counter: int, num_blocks: int, *,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """The ChaCha20 block function (RFC 8439 §2.3) for consecutive block counters.

    The state is held in int32 (half the memory traffic of int64 words, which is what the
    elementwise kernels are bound by).

    Args:
        key: 32 bytes.
        nonce: 12 bytes.
        counter: the first 32-bit block counter.
        num_blocks: how many consecutive blocks (counter, counter + 1, ...).
        device: where to compute (any device with int32 bitwise ops).

    Returns:
        int64 tensor [num_blocks, 16] of the serialised blocks' little-endian 32-bit words
        (values in [0, 2^32)); row-major it is the keystream in order.

    Raises:
        ValueError: on a wrong key or nonce length, or a counter leaving 32 bits (the
            stream would wrap onto blocks already used).
    """
    if len(key) != _KEY_BYTES or len(nonce) != _NONCE_BYTES:
        raise ValueError("ChaCha20 needs a 32-byte key and a 12-byte nonce")
    if num_blocks < 0 or counter < 0 or counter + num_blocks > 2**32:
        raise ValueError("the 32-bit block counter would wrap")
    device = torch.device(device)
    fixed = _int32_words([*_CONSTANTS, *_words_le(key)], device)
    state = torch.empty((16, num_blocks), dtype=torch.int32, device=device)
    state[:12] = fixed[:, None]
    # counters < 2^32: the int64 -> int32 cast keeps the low 32 bits (two's complement)
    state[12] = torch.arange(counter, counter + num_blocks, dtype=torch.int64,
                             device=device).to(torch.int32)
    state[13:] = _int32_words(_words_le(nonce), device)[:, None]
    x = state.clone().view(4, 4, num_blocks)
    a, b, c, d = x[0], x[1], x[2], x[3]  # rows 0-3, 4-7, 8-11, 12-15 of the 4x4 matrix
    for _ in range(10):  # 20 rounds = 10 x (column round, diagonal round), RFC 8439 §2.3
        _quarter_round(a, b, c, d)
        # diagonal round: QR(0,5,10,15) QR(1,6,11,12) QR(2,7,8,13) QR(3,4,9,14), i.e. the
        # columns after rotating row 1 left by 1, row 2 by 2, row 3 by 3
        b2, c2, d2 = b.roll(-1, 0), c.roll(-2, 0), d.roll(-3, 0)
        _quarter_round(a, b2, c2, d2)
        b.copy_(b2.roll(1, 0))
        c.copy_(c2.roll(2, 0))
        d.copy_(d2.roll(3, 0))
    words = x.view(16, num_blocks).add_(state)
    return words.t().to(torch.int64).bitwise_and_(_MASK32)


def keystream_backend(device: torch.device) -> KeystreamBackend:
    """The keystream implementation for ``device``: ``openssl`` on the CPU of a
    little-endian host where the ``cryptography`` package imports, else ``torch``."""
    if device.type != "cpu" or sys.byteorder != "little":
        return "torch"
    try:
        import cryptography.hazmat.primitives.ciphers  # noqa: F401  # availability only
    except ImportError:  # pragma: no cover - a dependency of dpsynth_shared
        return "torch"
    return "openssl"


class _OpenSslKeystream:
    """Consecutive ChaCha20 blocks of one (key, nonce) from OpenSSL, read in order.

    ``cryptography``'s ChaCha20 takes a 16-byte nonce: the 32-bit little-endian initial
    block counter, then RFC 8439's 96-bit nonce; encrypting zeros yields the keystream.
    The caller checks that the counter never passes 2^32 (OpenSSL would carry it into the
    nonce). The output buffer is reused: a view returned by :meth:`read` is valid until
    the next call.
    """

    def __init__(self, key: bytes, nonce: bytes, counter: int = 0) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        self._encryptor = Cipher(algorithms.ChaCha20(key, counter.to_bytes(4, "little")
                                                     + nonce), mode=None).encryptor()
        self._zeros = bytes(0)
        self._buffer = bytearray(0)

    def read(self, num_blocks: int) -> torch.Tensor:
        """The next ``num_blocks`` blocks as int64 values of 8 keystream bytes each
        (little-endian): value j holds 32-bit words 2j (low half) and 2j + 1 (high half)."""
        size = 64 * num_blocks
        if len(self._buffer) < size:
            self._zeros, self._buffer = bytes(size), bytearray(size)
        out = memoryview(self._buffer)[:size]
        self._encryptor.update_into(memoryview(self._zeros)[:size], out)
        return torch.frombuffer(out, dtype=torch.int64)


def check_keystream(device: torch.device,
                    backend: KeystreamBackend | None = None) -> None:
    """Known-answer test of the block function on ``device`` (once per process, device and
    implementation).

    The integer kernels differ per backend (CPU, CUDA, OpenSSL's assembly per instruction
    set); a wrong keystream would still give plausible-looking noise, so each is checked
    against RFC 8439 §2.3.2 before its first draw (about a millisecond).

    Raises:
        RuntimeError: if the block differs from the RFC's.
    """
    backend = backend or keystream_backend(device)
    if (device, backend) in _checked_devices:
        return
    key = bytes(range(32))
    if backend == "openssl":
        got = _OpenSslKeystream(key, _KAT_NONCE, 1).read(1).numpy().tobytes()
    else:
        words = chacha20_blocks(key, _KAT_NONCE, 1, 1, device=device)
        got = b"".join(int(w).to_bytes(4, "little") for w in words.flatten().tolist())
    if got != _KAT_BLOCK:
        raise RuntimeError(f"ChaCha20 known-answer test failed on {device} ({backend})")
    _checked_devices.add((device, backend))


def uniforms_from_words(words: torch.Tensor) -> torch.Tensor:
    """float64 uniforms in (0, 1] from pairs of 32-bit keystream words.

    Each uniform uses 64 bits: 8 keystream bytes read as a little-endian 64-bit integer, i.e.
    words (``lo``, ``hi``) in stream order; its top 53 bits form ``k`` in [0, 2^53) and the
    uniform is ``(k + 1) * 2^-53``: every value is exact in float64, 0 never occurs.

    Args:
        words: int64 tensor of 32-bit words, even length (flattened).
    """
    pairs = words.reshape(-1, 2)
    k = (pairs[:, 1] << 21) | (pairs[:, 0] >> 11)
    return (k + 1).to(torch.float64).mul_(2.0**-53)


def uniforms_from_le64(values: torch.Tensor) -> torch.Tensor:
    """:func:`uniforms_from_words` of keystream bytes read as little-endian int64.

    Value j of ``values`` is the 64-bit integer of bytes 8j..8j+7; ``k`` is its top 53 bits
    (``>> 11`` sign-extends a negative int64; the mask drops those bits).
    """
    k = (values >> 11).bitwise_and_((1 << 53) - 1)
    return k.add_(1).to(torch.float64).mul_(2.0**-53)


def secure_sum(uniforms: torch.Tensor, std: float) -> torch.Tensor:
    """opacus' secure-mode Gaussians from uniforms: value i is ``(z1 + z2 + z3 + z4) std / 2``
    with (z1, z2) and (z3, z4) the two Box–Muller pairs of uniforms 4i..4i+3 (float64).

    A Box–Muller pair's sum is computed as ``r (cos t + sin t)`` (= ``r cos t + r sin t`` to
    float64 rounding), and the two pairs are added without a reduction kernel: per value one
    ``log``, ``sqrt``, ``cos`` and ``sin`` per pair and a handful of elementwise ops, with no
    stacked intermediate (about half the time of stacking both outputs and summing).

    Args:
        uniforms: float64 uniforms in (0, 1], a multiple of 4 (flattened).
        std: the Gaussians' standard deviation.
    """
    quads = uniforms.view(-1, 2, 2)  # [value, pair, (u1, u2)]
    radius = quads[..., 0].log().mul_(-2.0).sqrt_()
    angle = quads[..., 1].mul(2.0 * math.pi)
    pairs = angle.cos().add_(angle.sin_()).mul_(radius)  # [value, pair]: z1 + z2, z3 + z4
    return pairs[:, 0].add(pairs[:, 1]).mul_(std / 2.0)


class ChaChaGaussian:
    """Gaussian noise from a ChaCha20 keystream with one key (one engine, one attempt).

    Use :meth:`from_os_entropy` in production; :meth:`keyed_by` is for tests only.

    Attributes:
        kind: ``"os"`` for a key from OS entropy, ``"test"`` for keys from a test's seeded
            generator.
        calls: how many nonces (calls to :meth:`gaussian`) this source has used.
    """

    def __init__(self, key: bytes, *, kind: NoiseKind, chunk: int | None = None,
                 keystream: KeystreamBackend | None = None,
                 _key_generator: torch.Generator | None = None) -> None:
        """Args:
            key: 32 bytes; never reuse one across sources.
            kind: ``"os"`` or ``"test"`` (see the attribute).
            chunk: output values computed per pass (bounds the temporary memory); default
                2^16 on a CPU (cache-sized), 2^22 on a GPU.
            keystream: force one implementation of the block function (tests, benchmarks);
                None picks per device (:func:`keystream_backend`). Both give the same
                bytes, so the same noise.
            _key_generator: tests only, see :meth:`keyed_by`.
        """
        if len(key) != _KEY_BYTES:
            raise ValueError("a ChaCha20 key is 32 bytes")
        if chunk is not None and (chunk < 2 or chunk % 2):
            raise ValueError("chunk must be an even number >= 2")
        if keystream == "openssl" and sys.byteorder != "little":
            raise ValueError("the openssl keystream path reads little-endian words")
        self._key = key
        self.kind: NoiseKind = kind
        self.calls = 0
        self._chunk = chunk
        self._keystream = keystream
        self._key_generator = _key_generator

    @classmethod
    def from_os_entropy(cls) -> ChaChaGaussian:
        """A source keyed with 256 fresh bits from the OS (``secrets.token_bytes``)."""
        return cls(secrets.token_bytes(_KEY_BYTES), kind="os")

    @classmethod
    def keyed_by(cls, generator: torch.Generator) -> ChaChaGaussian:
        """Tests only: a reproducible source whose keys come from a seeded generator.

        Each call to :meth:`gaussian` draws a fresh 256-bit key from ``generator`` (32
        bytes, ``torch.randint``; nonce 0), so the noise is a function of the generator's
        stream, interleaved with the test's other draws as ``torch.normal``'s was:
        replaying the generator's state replays the noise. Never for production (the key
        comes from a Mersenne Twister).
        """
        return cls(bytes(_KEY_BYTES), kind="test", _key_generator=generator)

    def _next_key_and_nonce(self) -> tuple[bytes, bytes]:
        """This call's (key, nonce): the source's key with nonce = the call's index; or
        (tests) a key drawn from the generator with nonce 0, so that the noise depends on
        the generator's stream alone (a replayed generator replays it)."""
        self.calls += 1
        if self._key_generator is None:
            return self._key, (self.calls - 1).to_bytes(_NONCE_BYTES, "little")
        g = self._key_generator
        drawn = torch.randint(0, 256, (_KEY_BYTES,), generator=g, device=g.device,
                              dtype=torch.uint8)
        return bytes(drawn.cpu().tolist()), bytes(_NONCE_BYTES)

    def gaussian(self, shape: torch.Size | tuple[int, ...], std: float, *,
                 device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Independent N(0, std^2) values of ``shape`` on ``device``, cast to ``dtype`` last.

        Each value is ``(z1 + z2 + z3 + z4) * std / 2`` with z_i standard normals from
        Box–Muller on keystream uniforms (opacus secure mode, n = 2). Uses a fresh nonce.

        Raises:
            ValueError: if ``std < 0`` or the tensor needs more than 2^32 blocks.
        """
        if std < 0 or not math.isfinite(std):
            raise ValueError("std must be finite and >= 0")
        device = torch.device(device)
        count = math.prod(shape)
        if std == 0:
            return torch.zeros(shape, dtype=dtype, device=device)
        # 16 words per block = 2 output values; the last block may be half used
        if (count + count % 2) * _WORDS_PER_OUTPUT // 16 > 2**32:
            raise ValueError("the noise tensor needs more than 2^32 ChaCha20 blocks")
        backend = self._keystream or keystream_backend(device)
        check_keystream(device, backend)
        key, nonce = self._next_key_and_nonce()
        chunk = self._chunk or (1 << 22 if device.type == "cuda" else 1 << 16)
        stream = _OpenSslKeystream(key, nonce) if backend == "openssl" else None
        out = torch.empty(count, dtype=dtype, device=device)
        for start in range(0, count, chunk):
            size = min(chunk, count - start)
            size_even = size + size % 2  # 16 words per block = 2 output values
            blocks = size_even * _WORDS_PER_OUTPUT // 16
            # value i uses keystream words 8i..8i+7 = uniforms (u1, u2, u1', u2'), whatever
            # the chunking and the implementation (so CPU and GPU give the same values for
            # the same key); chunks are consecutive, so the OpenSSL stream is read in order
            if stream is not None:
                uniforms = uniforms_from_le64(stream.read(blocks))
            else:
                first_block = start * _WORDS_PER_OUTPUT // 16
                uniforms = uniforms_from_words(
                    chacha20_blocks(key, nonce, first_block, blocks, device=device))
            # opacus secure mode: sum of 2n = 4 draws of N(0, std^2), divided by sqrt(2n)
            noise = secure_sum(uniforms, std)
            out[start:start + size] = noise[:size].to(dtype)
        return out.view(shape)
