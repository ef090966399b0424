"""KIE DP-Adam training: the frozen set, the hooks, the saved model (docs/kie.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch
from dpsynth_ml.kie import (
    HashingTokenizer,
    KieDpSettings,
    build_kie_model,
    encode_documents,
    evaluate_kie,
    load_kie_model,
    parse_kie_dataset,
    tiny_config,
    train_kie_dp,
)
from dpsynth_ml.training.hooks import NullHooks

pytestmark = pytest.mark.unit

LABELS = ("O", "B-KEY", "I-KEY")
SEQ = 16
REL_POS = ("layoutlmv3.encoder.rel_pos_bias.weight", "layoutlmv3.encoder.rel_pos_x_bias.weight",
           "layoutlmv3.encoder.rel_pos_y_bias.weight")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _dataset() -> object:
    docs = [{"id": f"d{i}", "words": ["Total", ":", f"{i}.00", "Date", f"0{i}/01"] * (1 + i),
             "boxes": [[10 * j, 20, 10 * j + 8, 30] for j in range(5 * (1 + i))],
             "labels": [1, 0, 0, 1, 2] * (1 + i)} for i in range(4)]
    return {"format": "dpsynth-kie/1", "label_names": list(LABELS), "documents": docs}


class CountingHooks(NullHooks):
    def __init__(self, grant: int, stop_after: int | None = None) -> None:
        self.grant, self.stop_after = grant, stop_after
        self.leases: list[tuple[int, int]] = []
        self.progress: list[int] = []
        self.stats: list[Mapping[str, float]] = []

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        self.leases.append((start, count))
        granted = min(count, self.grant)
        self.grant -= granted
        return granted

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.progress) >= self.stop_after

    def on_progress(self, step: int, total: int) -> None:
        self.progress.append(step)

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        self.stats.append(stats)


def test_c_trains_under_opacus_with_the_frozen_set_unchanged(tmp_path: Path) -> None:
    dataset = parse_kie_dataset(_dataset())
    chunks = encode_documents(dataset, HashingTokenizer(512), SEQ)
    kie = build_kie_model(tiny_config(max_seq_len=SEQ), LABELS)  # opacus smoke check
    assert kie.frozen == REL_POS
    before = {n: p.detach().clone() for n, p in kie.model.named_parameters()}
    settings = KieDpSettings(steps=3, sample_rate=1.0, expected_batch_size=4,
                             noise_multiplier=0.5, max_grad_norm=1.0, learning_rate=1e-2,
                             max_physical_batch_size=3, lease_size=2)
    hooks = CountingHooks(grant=100)
    result = train_kie_dp(kie, chunks, settings, hooks, generator=torch.Generator().manual_seed(0),
                          output_dir=tmp_path / "out")
    assert (result.steps, result.stopped, result.frozen) == (3, False, REL_POS)
    assert hooks.leases == [(0, 2), (2, 1)] and hooks.progress == [1, 2, 3]
    assert all(s["batch_size"] == 4 for s in hooks.stats)
    for name, param in kie.model.named_parameters():
        changed = not torch.equal(before[name], param.detach())
        assert changed == (name not in REL_POS), name
        assert param.requires_grad == (name not in REL_POS)
    meta = json.loads((tmp_path / "out" / "dpsynth_kie.json").read_text())
    assert meta["frozen_parameters"] == list(REL_POS) and meta["steps"] == 3
    assert meta["max_seq_len"] == SEQ and meta["label_names"] == list(LABELS)
    assert meta["dp"]["noise_multiplier"] == 0.5
    reloaded = load_kie_model(tmp_path / "out", LABELS)
    for name, param in reloaded.model.named_parameters():
        assert torch.equal(param, dict(kie.model.named_parameters())[name])
    scores = evaluate_kie(reloaded, dataset, chunks)
    assert 0.0 <= scores["entity_f1"] <= 1.0 and scores["documents"] == 4


def test_c_the_visual_branch_is_frozen_when_no_image_is_fed() -> None:
    config = {**tiny_config(max_seq_len=SEQ), "visual_embed": True}
    kie = build_kie_model(config, LABELS)
    assert {"layoutlmv3.cls_token", "layoutlmv3.pos_embed",
            "layoutlmv3.patch_embed.proj.weight", "layoutlmv3.norm.weight"} <= set(kie.frozen)
    assert set(REL_POS) <= set(kie.frozen)
    trainable = [n for n, p in kie.model.named_parameters() if p.requires_grad]
    assert "classifier.weight" in trainable and not set(trainable) & set(kie.frozen)


def test_steps_are_leased_first_and_a_stop_is_honoured() -> None:
    dataset = parse_kie_dataset(_dataset())
    chunks = encode_documents(dataset, HashingTokenizer(512), SEQ)
    kie = build_kie_model(tiny_config(max_seq_len=SEQ), LABELS, check=False)
    settings = KieDpSettings(steps=5, sample_rate=0.5, expected_batch_size=2,
                             noise_multiplier=1.0, max_grad_norm=1.0, lease_size=2)
    denied = CountingHooks(grant=1)
    result = train_kie_dp(kie, chunks, settings, denied, generator=torch.Generator())
    assert (result.steps, result.stopped) == (1, True) and denied.leases == [(0, 2), (1, 2)]
    stopping = CountingHooks(grant=100, stop_after=1)
    result = train_kie_dp(kie, chunks, settings, stopping, generator=torch.Generator())
    assert (result.steps, result.stopped, result.output_dir) == (1, True, None)


def test_a_sequence_longer_than_the_positions_is_refused() -> None:
    dataset = parse_kie_dataset(_dataset())
    chunks = encode_documents(dataset, HashingTokenizer(512), 64)
    kie = build_kie_model(tiny_config(max_seq_len=SEQ), LABELS, check=False)
    settings = KieDpSettings(steps=1, sample_rate=1.0, expected_batch_size=1,
                             noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        train_kie_dp(kie, chunks, settings, generator=torch.Generator())
