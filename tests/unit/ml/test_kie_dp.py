"""KIE under DP: the document (or owner) is the privacy unit of every step (docs/kie.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from dpsynth_ml.dp import SubjectBatch
from dpsynth_ml.kie import (
    EncodedChunks,
    HashingTokenizer,
    KieDpSettings,
    build_kie_model,
    encode_documents,
    parse_kie_dataset,
    tiny_config,
)
from dpsynth_ml.kie.train import accumulate_units, make_engine, make_sampler

from tests.unit.ml.dp_support import ZeroNoise

pytestmark = pytest.mark.unit

LABELS = ["O", "B-KEY", "I-KEY", "B-VAL", "I-VAL"]
SEQ = 8  # CLS + 6 tokens + SEP: a 19-word document makes 5 chunks


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _doc(i: int, words: int, subject: str | None = None) -> dict[str, object]:
    doc: dict[str, object] = {
        "id": f"doc-{i}", "words": [f"w{i}-{j}" for j in range(words)],
        "boxes": [[10 * j, 5 * i, 10 * j + 9, 5 * i + 4] for j in range(words)],
        "labels": [(i + j) % len(LABELS) for j in range(words)]}
    if subject is not None:
        doc["subject"] = subject
    return doc


def _chunks(docs: list[dict[str, object]]) -> EncodedChunks:
    dataset = parse_kie_dataset({"format": "dpsynth-kie/1", "label_names": LABELS,
                                 "documents": docs})
    return encode_documents(dataset, HashingTokenizer(512), SEQ)


def _batch(chunks: EncodedChunks, units: list[int]) -> SubjectBatch:
    parts = [(chunks.subject == u).nonzero().flatten() for u in units]
    counts = torch.tensor([p.numel() for p in parts])
    return SubjectBatch(torch.cat(parts), torch.repeat_interleave(torch.arange(len(units)),
                                                                  counts),
                        counts, torch.tensor(units))


def _released(settings: KieDpSettings, chunks: EncodedChunks,
              units: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
    """The released (noise-free, B = 1) sum of one step over ``units``, not applied."""
    torch.manual_seed(0)
    kie = build_kie_model(tiny_config(max_seq_len=SEQ, hidden_dropout_prob=0.0),
                          tuple(LABELS), check=False)
    engine = make_engine(kie, settings, _test_noise=ZeroNoise())
    try:
        stats = accumulate_units(engine, chunks, _batch(chunks, units),
                                 settings.max_physical_batch_size)
        engine.privatize()
        flat = torch.cat([p.grad.detach().flatten().double() for p in engine.params
                          if p.grad is not None])
        return flat, stats
    finally:
        engine.close()


def test_a_five_chunk_document_adds_at_most_c_to_the_clipped_sum() -> None:
    docs = [_doc(0, 19), _doc(1, 2), _doc(2, 3)]
    chunks = _chunks(docs)
    per_doc = torch.bincount(chunks.document).tolist()
    assert per_doc == [5, 1, 1]
    clip = 1e-3
    # micro-batches of 2 sequences: the long document spans three, carried across them
    settings = KieDpSettings(steps=1, sample_rate=1.0, expected_batch_size=1,
                             noise_multiplier=1.0, max_grad_norm=clip,
                             max_physical_batch_size=2)
    with_doc, stats = _released(settings, chunks, [0, 1, 2])
    without, _ = _released(settings, chunks, [1, 2])
    alone, alone_stats = _released(settings, chunks, [0])
    assert stats["batch_size"] == 3 and stats["chunks"] == 7
    assert alone_stats["fraction_clipped"] == 1.0  # clipping is active
    assert float(torch.linalg.vector_norm(with_doc - without)) <= clip * (1 + 1e-6)
    assert float(torch.linalg.vector_norm(alone)) <= clip * (1 + 1e-6)
    # clipped ONCE: exactly C, not the up-to-5C sum of five separately clipped chunks
    assert float(torch.linalg.vector_norm(alone)) == pytest.approx(clip, rel=1e-4)
    # the same sum whatever the micro-batch cut
    one_batch, _ = _released(KieDpSettings(**{**settings.__dict__,
                                              "max_physical_batch_size": 16}),
                             chunks, [0, 1, 2])
    assert torch.allclose(one_batch, with_doc, rtol=1e-4, atol=1e-9)


def test_b_the_sample_rate_is_per_document_and_chunks_move_together() -> None:
    docs = [_doc(i, 2 + 4 * i) for i in range(5)]
    chunks = _chunks(docs)
    assert chunks.chunks_per_subject().tolist()[-1] >= 3
    q, steps = 0.3, 300
    settings = KieDpSettings(steps=steps, sample_rate=q, expected_batch_size=2,
                             noise_multiplier=1.0, max_grad_norm=1.0)
    sampler = make_sampler(chunks, settings, torch.Generator().manual_seed(7))
    assert sampler.num_records == 5  # N counts documents, not chunks
    seen = torch.zeros(5)
    for _ in range(steps):
        batch = sampler.sample()
        drawn = set(batch.indices.tolist())
        for d in range(5):
            own = set((chunks.document == d).nonzero().flatten().tolist())
            assert own <= drawn or not own & drawn
            seen[d] += bool(own & drawn)
        assert batch.counts.tolist() == chunks.chunks_per_subject()[batch.subjects].tolist()
    assert torch.all((seen / steps - q).abs() < 0.12)


def test_b_owners_are_the_unit_when_documents_declare_them() -> None:
    docs = [_doc(0, 5, "alice"), _doc(1, 9, "bob"), _doc(2, 7, "alice")]
    chunks = _chunks(docs)
    assert chunks.num_subjects == 2
    settings = KieDpSettings(steps=1, sample_rate=0.5, expected_batch_size=1,
                             noise_multiplier=1.0, max_grad_norm=1.0)
    sampler = make_sampler(chunks, settings, torch.Generator().manual_seed(3))
    alice = set((chunks.subject == 0).nonzero().flatten().tolist())
    assert {int(chunks.document[i]) for i in alice} == {0, 2}
    for _ in range(100):
        drawn = set(sampler.sample().indices.tolist())
        assert alice <= drawn or not alice & drawn


@pytest.mark.parametrize("expected", [1, 4])
def test_d_noise_std_is_sigma_c_over_the_expected_batch(expected: int) -> None:
    torch.manual_seed(0)
    kie = build_kie_model(tiny_config(max_seq_len=SEQ), tuple(LABELS), check=False)
    sigma, clip = 2.0, 0.5
    settings = KieDpSettings(steps=1, sample_rate=0.1, expected_batch_size=expected,
                             noise_multiplier=sigma, max_grad_norm=clip)
    engine = make_engine(kie, settings)
    try:
        empty = torch.zeros(0, dtype=torch.long)
        chunks = _chunks([_doc(0, 3)])
        stats = accumulate_units(engine, chunks, SubjectBatch(empty, empty, empty, empty), 4)
        assert stats["batch_size"] == 0
        engine.privatize()
        noise = torch.cat([p.grad.flatten().double() for p in engine.params
                           if p.grad is not None])
    finally:
        engine.close()
    assert noise.numel() > 100_000
    assert float(noise.std()) == pytest.approx(sigma * clip / expected, rel=0.02)
    assert abs(float(noise.mean())) < 0.01 * sigma * clip / expected
