"""KIE inputs: the dpsynth-kie/1 file, chunking, the allow-listed config, safetensors."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from dpsynth_ml.errors import InvalidSpecError
from dpsynth_ml.kie import (
    HashingTokenizer,
    build_kie_model,
    encode_documents,
    load_kie_dataset,
    load_kie_model,
    parse_kie_dataset,
    save_kie_model,
    tiny_config,
)
from dpsynth_ml.kie.tokenize import IGNORE

pytestmark = pytest.mark.unit

LABELS = ["O", "B-KEY", "I-KEY"]


def _file() -> dict[str, Any]:
    return {"format": "dpsynth-kie/1", "label_names": list(LABELS), "documents": [
        {"id": "a", "class": "invoice", "words": ["Total", "12.00", "EUR"],
         "boxes": [[0, 0, 10, 10], [20, 0, 40, 10], [45, 0, 60, 10]], "labels": [1, 2, 0]},
        {"id": "b", "words": ["Date"], "boxes": [[5, 5, 9, 9]], "labels": [1]}]}


def test_loads_json_and_gz_with_one_unit_per_document(tmp_path: Path) -> None:
    plain, packed = tmp_path / "d.json", tmp_path / "d.json.gz"
    plain.write_text(json.dumps(_file()))
    packed.write_bytes(gzip.compress(json.dumps(_file()).encode()))
    for path in (plain, packed):
        data = load_kie_dataset(path)
        assert data.label_names == tuple(LABELS) and data.num_subjects == 2
        assert data.subjects.tolist() == [0, 1] and data.privacy_unit == "document"
        assert data.documents[0].doc_class == "invoice"
        assert data.documents[0].boxes[1] == (20, 0, 40, 10)


def test_declared_owners_are_the_units() -> None:
    raw = _file()
    raw["documents"].append({**raw["documents"][1], "id": "c"})
    for doc, owner in zip(raw["documents"], ["x", "y", "x"], strict=True):
        doc["subject"] = owner
    data = parse_kie_dataset(raw)
    assert data.subjects.tolist() == [0, 1, 0] and data.num_subjects == 2
    assert data.privacy_unit == "subject"


def _broken(change: str) -> dict[str, Any]:
    raw = copy.deepcopy(_file())
    doc = raw["documents"][0]
    if change == "format":
        raw["format"] = "dpsynth-kie/2"
    elif change == "extra":
        raw["secret"] = 1
    elif change == "labels":
        doc["labels"] = [1, 2, 3]
    elif change == "length":
        doc["boxes"] = doc["boxes"][:2]
    elif change == "box":
        doc["boxes"][0] = [0, 0, 1001, 10]
    elif change == "order":
        doc["boxes"][0] = [10, 0, 5, 10]
    elif change == "ids":
        raw["documents"][1]["id"] = "a"
    elif change == "subject":
        doc["subject"] = "x"
    elif change == "empty":
        doc["words"], doc["boxes"], doc["labels"] = [], [], []
    elif change == "names":
        raw["label_names"] = ["O", "O"]
    return raw


@pytest.mark.parametrize(("change", "message"), [
    ("format", "format must be"), ("extra", "unknown top-level"),
    ("labels", r"documents\[0\].labels\[2\]"), ("length", "one box per word"),
    ("box", r"documents\[0\].boxes\[0\] must be 4 integers"), ("order", "x0 <= x1"),
    ("ids", "unique"), ("subject", "every document or on none"),
    ("empty", "non-empty"), ("names", "label_names must be unique")])
def test_bad_files_are_refused_precisely(change: str, message: str) -> None:
    with pytest.raises(InvalidSpecError, match=message):
        parse_kie_dataset(_broken(change))


def test_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text("{not json")
    with pytest.raises(InvalidSpecError, match="not valid JSON"):
        load_kie_dataset(path)


def test_chunks_keep_words_whole_and_label_their_first_piece() -> None:
    raw = _file()
    raw["documents"][0]["words"][0] = "Totalamountdue"  # 3 pieces
    data = parse_kie_dataset(raw)
    tok = HashingTokenizer(512)
    assert len(tok.pieces("Totalamountdue")) == 3 and tok.pieces("ab") == tok.pieces("ab")
    chunks = encode_documents(data, tok, 6)  # 4 tokens per chunk: 3 | 2 + 1 pieces
    assert chunks.document.tolist() == [0, 0, 1] and chunks.subject.tolist() == [0, 0, 1]
    assert chunks.input_ids[0, 0] == tok.cls_id and chunks.input_ids[0, 4] == tok.sep_id
    assert chunks.labels[0].tolist() == [IGNORE, 1, IGNORE, IGNORE, IGNORE, IGNORE]
    assert chunks.labels[1].tolist() == [IGNORE, 2, IGNORE, 0, IGNORE, IGNORE]
    assert chunks.bbox[0, 1:4].tolist() == [[0, 0, 10, 10]] * 3
    assert chunks.attention_mask[2].tolist() == [1, 1, 1, 0, 0, 0]
    assert chunks.word_index[1].tolist() == [-1, 1, -1, 2, -1, -1]


@pytest.mark.parametrize(("key", "value", "message"), [
    ("auto_map", {"AutoModel": "evil.Model"}, "'auto_map' is not allowed"),
    ("trust_remote_code", True, "not allowed"), ("hidden_size", 10 ** 6, "hidden_size"),
    ("num_hidden_layers", "2", "num_hidden_layers"), ("model_type", "bert", "model_type"),
    ("architectures", ["EvilModel"], "architectures"), ("hidden_act", "exec", "hidden_act"),
    ("coordinate_size", 8, "coordinate_size")])
def test_disallowed_config_keys_are_refused(key: str, value: object, message: str) -> None:
    with pytest.raises(InvalidSpecError, match=message):
        build_kie_model({**tiny_config(), key: value}, tuple(LABELS), check=False)


def test_safetensors_round_trip_and_no_pickle(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    kie = build_kie_model(tiny_config(max_seq_len=8), tuple(LABELS), seed=3, check=False)
    save_kie_model(kie, tmp_path / "m", {"steps": 0})
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "config.json", "dpsynth_kie.json", "model.safetensors"]
    again = load_kie_model(tmp_path / "m", tuple(LABELS), check=False)
    assert again.frozen == kie.frozen
    theirs = again.model.state_dict()
    for name, tensor in kie.model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    # a new label set keeps the body and starts a fresh classifier
    relabelled = load_kie_model(tmp_path / "m", ("O", "B-A", "I-A", "B-B", "I-B"), check=False)
    assert relabelled.model.classifier.out_features == 5
    (tmp_path / "m" / "model.safetensors").rename(tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(InvalidSpecError, match="no pickle"):
        load_kie_model(tmp_path / "m", tuple(LABELS))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(InvalidSpecError, match="cannot be read"):
        load_kie_model(tmp_path / "m", tuple(LABELS))


def test_a_model_directory_tokenizer_json_is_read_offline(tmp_path: Path) -> None:
    from dpsynth_ml.kie import JsonTokenizer
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "Total": 4, "Date": 5}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = JsonTokenizer(tmp_path / "tokenizer.json")
    assert (loaded.cls_id, loaded.pad_id, loaded.sep_id) == (0, 1, 2)
    assert loaded.pieces("Total") == [4] and loaded.pieces("nope") == [3]
    chunks = encode_documents(parse_kie_dataset(_file()), loaded, 8)
    assert chunks.input_ids[1, :3].tolist() == [0, 5, 2]
    with pytest.raises(InvalidSpecError, match=r"tokenizer\.json"):
        JsonTokenizer(tmp_path / "missing.json")
