"""The DP noise source: ChaCha20 (RFC 8439) keystream -> uniforms -> Gaussians.

Known-answer tests from RFC 8439 §2.3.2 and §2.4.2 (and against the ``cryptography``
package's ChaCha20 for random keys), goodness of fit of the Gaussians, nonce/counter
layout, and key freshness. The engine-level tests are in ``test_noise_in_engine.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from dpsynth_ml.dp.noise import (
    ChaChaGaussian,
    chacha20_blocks,
    keystream_backend,
    uniforms_from_le64,
    uniforms_from_words,
)
from scipy import stats

CPU = torch.device("cpu")
RFC_KEY = bytes(range(32))
# RFC 8439 §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1
RFC_232_NONCE = bytes.fromhex("000000090000004a00000000")
RFC_232_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")
# RFC 8439 §2.4.2: same key, nonce 00:00:00:00:00:00:00:4a:00:00:00:00, counter 1
RFC_242_NONCE = bytes.fromhex("000000000000004a00000000")
RFC_242_PLAINTEXT = (b"Ladies and Gentlemen of the class of '99: If I could offer you only "
                     b"one tip for the future, sunscreen would be it.")
RFC_242_CIPHERTEXT = bytes.fromhex(
    "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
    "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
    "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
    "5af90bbf74a35be6b40b8eedf2785e42874d")

def _serialise(words: torch.Tensor) -> bytes:
    """Keystream bytes of [blocks, 16] little-endian 32-bit words (RFC 8439 §2.3)."""
    return b"".join(int(w).to_bytes(4, "little") for w in words.flatten().cpu().tolist())


def _encrypt(key: bytes, nonce: bytes, counter: int, plaintext: bytes,
             device: torch.device) -> bytes:
    blocks = chacha20_blocks(key, nonce, counter, -(-len(plaintext) // 64), device=device)
    stream = _serialise(blocks)
    return bytes(p ^ s for p, s in zip(plaintext, stream, strict=False))


def box_muller(u1: torch.Tensor, u2: torch.Tensor) -> torch.Tensor:
    """The textbook transform, both outputs: ``(r cos(2 pi u2), r sin(2 pi u2))`` with
    ``r = sqrt(-2 ln u1)`` (Box & Muller 1958), the reference the source is checked against."""
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = 2.0 * math.pi * u2
    return torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1)


# keystream ---------------------------------------------------------------------------------

def test_block_function_matches_rfc8439_section_2_3_2() -> None:
    block = chacha20_blocks(RFC_KEY, RFC_232_NONCE, 1, 1)
    assert block.dtype == torch.int64 and block.shape == (1, 16)
    assert _serialise(block) == RFC_232_BLOCK


def test_encryption_matches_rfc8439_section_2_4_2() -> None:
    assert _encrypt(RFC_KEY, RFC_242_NONCE, 1, RFC_242_PLAINTEXT, CPU) == RFC_242_CIPHERTEXT


def test_keystream_matches_an_independent_chacha20_for_random_keys() -> None:
    ciphers = pytest.importorskip("cryptography.hazmat.primitives.ciphers")
    algorithms = pytest.importorskip("cryptography.hazmat.primitives.ciphers.algorithms")
    g = torch.Generator().manual_seed(0)
    for counter in (0, 7, 2**32 - 5):  # the last one ends exactly at the counter's top
        key = bytes(torch.randint(0, 256, (32,), generator=g).tolist())
        nonce = bytes(torch.randint(0, 256, (12,), generator=g).tolist())
        ours = _serialise(chacha20_blocks(key, nonce, counter, 5))
        # cryptography's ChaCha20 nonce = 32-bit LE block counter || 96-bit nonce
        cipher = ciphers.Cipher(algorithms.ChaCha20(key, counter.to_bytes(4, "little") + nonce),
                                mode=None)
        assert ours == cipher.encryptor().update(bytes(5 * 64))


def test_the_block_counter_never_wraps() -> None:
    chacha20_blocks(RFC_KEY, RFC_232_NONCE, 2**32 - 1, 1)  # the last block is fine
    with pytest.raises(ValueError, match="wrap"):
        chacha20_blocks(RFC_KEY, RFC_232_NONCE, 2**32 - 1, 2)
    with pytest.raises(ValueError, match="32-byte key"):
        chacha20_blocks(RFC_KEY[:16], RFC_232_NONCE, 0, 1)


def test_a_device_whose_keystream_is_wrong_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsynth_ml.dp.noise as noise_module

    monkeypatch.setattr(noise_module, "_checked_devices", set())
    broken = (*noise_module._CONSTANTS[:3], 0)  # as a miscompiled backend might compute
    monkeypatch.setattr(noise_module, "_CONSTANTS", broken)
    with pytest.raises(RuntimeError, match=r"known-answer test failed on cpu \(torch\)"):
        ChaChaGaussian(bytes(32), kind="test", keystream="torch").gaussian(
            (4,), 1.0, device=CPU, dtype=torch.float32)


def test_an_openssl_keystream_that_is_wrong_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsynth_ml.dp.noise as noise_module

    monkeypatch.setattr(noise_module, "_checked_devices", set())
    real_read = noise_module._OpenSslKeystream.read

    def flipped(self: object, num_blocks: int) -> torch.Tensor:
        return real_read(self, num_blocks) ^ 1  # one wrong bit per 8 bytes

    monkeypatch.setattr(noise_module._OpenSslKeystream, "read", flipped)
    with pytest.raises(RuntimeError, match=r"known-answer test failed on cpu \(openssl\)"):
        ChaChaGaussian(bytes(32), kind="test", keystream="openssl").gaussian(
            (4,), 1.0, device=CPU, dtype=torch.float32)


def test_the_cpu_uses_openssl_and_other_devices_the_torch_kernels() -> None:
    assert keystream_backend(CPU) == "openssl"
    assert keystream_backend(torch.device("cuda")) == "torch"
    assert keystream_backend(torch.device("meta")) == "torch"


@pytest.mark.parametrize(("size", "chunk"), [(1, None), (1001, None), (1001, 6),
                                              ((1 << 16) + 3, None), (70_001, 1 << 12)])
def test_both_keystream_implementations_give_the_same_noise(size: int,
                                                           chunk: int | None) -> None:
    g = torch.Generator().manual_seed(size)
    for _ in range(3):
        key = bytes(torch.randint(0, 256, (32,), generator=g).tolist())
        sources = [ChaChaGaussian(key, kind="test", chunk=chunk, keystream=backend)
                   for backend in ("torch", "openssl")]
        for call in range(2):  # nonce 0, then nonce 1
            a, b = (src.gaussian((size,), 0.9, device=CPU, dtype=torch.float64)
                    for src in sources)
            assert torch.equal(a, b), (size, chunk, call)


def test_little_endian_uniforms_equal_the_word_pair_uniforms() -> None:
    words = chacha20_blocks(bytes(range(32)), bytes(12), 2**32 - 3, 3)
    as_le64 = torch.frombuffer(bytearray(_serialise(words)), dtype=torch.int64)
    assert torch.equal(uniforms_from_le64(as_le64), uniforms_from_words(words))
    # the extremes: all-ones words give the top uniform 1, all-zeros the bottom 2^-53
    extremes = torch.tensor([-1, 0], dtype=torch.int64)
    assert uniforms_from_le64(extremes).tolist() == [1.0, 2.0**-53]


def test_a_tensor_past_the_block_counter_is_refused_before_any_draw() -> None:
    source = ChaChaGaussian(bytes(32), kind="test")
    with pytest.raises(ValueError, match="2\\^32 ChaCha20 blocks"):
        source.gaussian((2**33 + 2,), 1.0, device=torch.device("meta"), dtype=torch.float32)
    assert source.calls == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rfc8439_vectors_and_gaussians_on_cuda() -> None:
    cuda = torch.device("cuda")
    assert _serialise(chacha20_blocks(RFC_KEY, RFC_232_NONCE, 1, 1, device=cuda)) \
        == RFC_232_BLOCK
    assert _encrypt(RFC_KEY, RFC_242_NONCE, 1, RFC_242_PLAINTEXT, cuda) == RFC_242_CIPHERTEXT
    # same key -> same noise on either device (integer keystream; float64 maths may differ
    # in the last ulp between CPU and GPU libm)
    on_gpu = ChaChaGaussian(RFC_KEY, kind="test").gaussian((3, 1001), 0.7, device=cuda,
                                                            dtype=torch.float64)
    on_cpu = ChaChaGaussian(RFC_KEY, kind="test").gaussian((3, 1001), 0.7, device=CPU,
                                                            dtype=torch.float64)
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-12, atol=1e-12)


# uniforms and Gaussians --------------------------------------------------------------------

def test_uniforms_use_53_bits_and_are_never_zero() -> None:
    words = torch.tensor([0, 0, 0xFFFFFFFF, 0xFFFFFFFF, 0x800, 0, 0, 0x80000000])
    u = uniforms_from_words(words)
    assert u.dtype == torch.float64
    # (k + 1) 2^-53 with k the top 53 bits of the little-endian pair: hi << 21 | lo >> 11
    assert u.tolist() == [2.0**-53, 1.0, 2 * 2.0**-53, (2**52 + 1) * 2.0**-53]
    z = box_muller(u[:1], torch.tensor([0.25], dtype=torch.float64))
    assert torch.isfinite(z).all()


def test_gaussians_fit_n_0_sigma2() -> None:
    std, n = 2.5, 400_000
    z = ChaChaGaussian(bytes(32), kind="test").gaussian((n,), std, device=CPU,
                                                         dtype=torch.float64)
    assert z.shape == (n,) and z.dtype == torch.float64
    assert stats.kstest(z.numpy(), "norm", args=(0.0, std)).pvalue > 1e-3
    # mean and variance within 5 standard errors
    assert abs(z.mean().item()) < 5 * std / math.sqrt(n)
    assert abs(z.var().item() - std**2) < 5 * std**2 * math.sqrt(2 / (n - 1))
    # the tails too (KS is weak there): |z| > 3 std has probability 0.0026998
    tail = (z.abs() > 3 * std).double().mean().item()
    assert abs(tail - 0.0026998) < 5 * math.sqrt(0.0026998 / n)


def test_output_is_cast_to_the_requested_dtype_last() -> None:
    key = bytes(range(1, 33))
    wide = ChaChaGaussian(key, kind="test").gaussian((4, 257), 0.3, device=CPU,
                                                      dtype=torch.float64)
    narrow = ChaChaGaussian(key, kind="test").gaussian((4, 257), 0.3, device=CPU,
                                                        dtype=torch.float32)
    assert narrow.dtype == torch.float32 and narrow.shape == (4, 257)
    assert torch.equal(narrow, wide.to(torch.float32))


def test_each_value_is_opacus_secure_mode_sum_of_four_box_muller_draws() -> None:
    key = bytes(range(32))
    source = ChaChaGaussian(key, kind="test")
    noise = source.gaussian((3,), 1.5, device=CPU, dtype=torch.float64)
    # call 0 -> nonce 0, counters from 0; value i uses words 8i..8i+7 = 4 uniforms
    u = uniforms_from_words(chacha20_blocks(key, bytes(12), 0, 2)).view(-1, 2, 2)
    by_hand = box_muller(u[..., 0], u[..., 1]).sum(dim=(1, 2))[:3] * 1.5 / 2
    # the source adds each pair as r (cos + sin): equal to float64 rounding, not bit for bit
    torch.testing.assert_close(noise, by_hand, rtol=1e-14, atol=1e-15)


def test_values_do_not_depend_on_the_chunking() -> None:
    key = bytes(range(32))
    whole = ChaChaGaussian(key, kind="test").gaussian((1001,), 1.0, device=CPU,
                                                       dtype=torch.float64)
    chunked = ChaChaGaussian(key, kind="test", chunk=6).gaussian((1001,), 1.0, device=CPU,
                                                                   dtype=torch.float64)
    assert torch.equal(whole, chunked)


def test_every_call_uses_a_fresh_nonce_so_no_block_is_reused() -> None:
    key = bytes(range(32))
    source = ChaChaGaussian(key, kind="test")
    first = source.gaussian((64,), 1.0, device=CPU, dtype=torch.float64)
    second = source.gaussian((64,), 1.0, device=CPU, dtype=torch.float64)
    assert source.calls == 2
    assert not torch.isin(second, first).any()
    # the second call is exactly nonce 1 (LE), counters from 0
    u = uniforms_from_words(chacha20_blocks(key, (1).to_bytes(12, "little"), 0, 32))
    u = u.view(-1, 2, 2)
    torch.testing.assert_close(second, box_muller(u[..., 0], u[..., 1]).sum(dim=(1, 2)) / 2,
                               rtol=1e-14, atol=1e-15)


def test_zero_std_gives_zeros_and_negative_std_is_refused() -> None:
    source = ChaChaGaussian(bytes(32), kind="test")
    assert torch.equal(source.gaussian((5,), 0.0, device=CPU, dtype=torch.float32),
                       torch.zeros(5))
    with pytest.raises(ValueError):
        source.gaussian((5,), -1.0, device=CPU, dtype=torch.float32)


# keys --------------------------------------------------------------------------------------

def test_two_os_keyed_sources_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsynth_ml.dp.noise as noise_module

    asked: list[int] = []
    real = noise_module.secrets.token_bytes

    def token_bytes(n: int) -> bytes:
        asked.append(n)
        return real(n)

    monkeypatch.setattr(noise_module.secrets, "token_bytes", token_bytes)
    a, b = ChaChaGaussian.from_os_entropy(), ChaChaGaussian.from_os_entropy()
    assert asked == [32, 32]  # 256 bits of OS entropy each
    assert a.kind == b.kind == "os"
    za = a.gaussian((256,), 1.0, device=CPU, dtype=torch.float64)
    zb = b.gaussian((256,), 1.0, device=CPU, dtype=torch.float64)
    assert not torch.isin(za, zb).any()


def test_test_keys_come_from_the_generator_so_replaying_it_replays_the_noise() -> None:
    g = torch.Generator().manual_seed(5)
    source = ChaChaGaussian.keyed_by(g)
    assert source.kind == "test"
    state = g.get_state()
    first = source.gaussian((10,), 1.0, device=CPU, dtype=torch.float64)
    assert not torch.equal(g.get_state(), state)  # the key was drawn from the generator
    second = source.gaussian((10,), 1.0, device=CPU, dtype=torch.float64)
    assert not torch.isin(second, first).any()
    g.set_state(state)  # replay: the same key again (a test source's nonce is 0)
    replayed = ChaChaGaussian.keyed_by(g).gaussian((10,), 1.0, device=CPU,
                                                   dtype=torch.float64)
    assert torch.equal(replayed, first)
    # the key is the generator's next 32 random bytes
    key = bytes(torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(5),
                              dtype=torch.uint8).tolist())
    by_key = ChaChaGaussian(key, kind="test").gaussian((10,), 1.0, device=CPU,
                                                       dtype=torch.float64)
    assert torch.equal(by_key, first)
