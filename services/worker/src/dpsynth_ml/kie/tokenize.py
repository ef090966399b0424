"""Words + boxes → LayoutLMv3 sequences, cut into chunks that remember their document.

No tokenizer is ever downloaded. :class:`HashingTokenizer` is a deterministic word-piece
stand-in (each word → 1..3 ids by a stable BLAKE2b hash into the vocabulary; tests and
from-scratch models); :class:`JsonTokenizer` reads a model directory's ``tokenizer.json``
with the ``tokenizers`` library, offline.

Each word's first sub-token carries the word's label and the others -100 (ignored by the
loss); every sub-token repeats the word's box. A document is cut into chunks of at most
``max_seq_len`` tokens (CLS + pieces + SEP), never splitting a word; each chunk keeps its
document's index and its privacy unit's index, so the trainer can sample, fold and clip all
chunks of a unit together (docs/kie.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from dpsynth_ml.errors import InvalidSpecError
from dpsynth_ml.kie.data import KieDataset, KieDocument

IGNORE = -100
MAX_PIECES_PER_WORD = 8
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024


class WordTokenizer(Protocol):
    """What :func:`encode_documents` needs of a tokenizer."""

    cls_id: int
    sep_id: int
    pad_id: int

    def pieces(self, word: str) -> list[int]:
        """The word's sub-token ids (at least one)."""
        ...


class HashingTokenizer:
    """A stable hashing word-piece tokenizer over ``vocab_size`` ids (no download).

    Ids 0, 1, 2, 3 are CLS (``<s>``), PAD, SEP (``</s>``) and UNK, as in RoBERTa/LayoutLMv3;
    a word of n characters gives ``min(3, ceil(n / 4))`` pieces, each hashed (with its
    position in the word) into ``[4, vocab_size)``.
    """

    cls_id, pad_id, sep_id, unk_id = 0, 1, 2, 3

    def __init__(self, vocab_size: int, *, max_pieces: int = 3) -> None:
        if vocab_size < 8:
            raise ValueError("vocab_size must be >= 8")
        self.vocab_size = vocab_size
        self.max_pieces = max_pieces

    def pieces(self, word: str) -> list[int]:
        count = max(1, min(self.max_pieces, -(-len(word) // 4)))
        size = -(-len(word) // count)
        out = []
        for k in range(count):
            text = f"{k}\x00{word[k * size:(k + 1) * size]}".encode()
            digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
            out.append(4 + digest % (self.vocab_size - 4))
        return out


class JsonTokenizer:
    """A model directory's ``tokenizer.json`` (HF ``tokenizers``), read offline.

    Each word is encoded alone as a pre-tokenized word (the byte-level BPE of LayoutLMv3
    adds its prefix space itself), without special tokens, capped at
    :data:`MAX_PIECES_PER_WORD` pieces; CLS/SEP/PAD are ``<s>``/``</s>``/``<pad>`` (or
    ``[CLS]``/``[SEP]``/``[PAD]``).
    """

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file() or path.stat().st_size > MAX_TOKENIZER_BYTES:
            raise InvalidSpecError("tokenizer.json is missing or too large")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise InvalidSpecError("tokenizer.json cannot be read by tokenizers") from exc
        self.cls_id = self._special("<s>", "[CLS]")
        self.sep_id = self._special("</s>", "[SEP]")
        self.pad_id = self._special("<pad>", "[PAD]")
        self.unk_id = self._special("<unk>", "[UNK]")
        self.vocab_size = int(self._tok.get_vocab_size())

    def _special(self, *names: str) -> int:
        for name in names:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        raise InvalidSpecError(f"tokenizer.json has none of the tokens {names}")

    def pieces(self, word: str) -> list[int]:
        ids = self._tok.encode([word], is_pretokenized=True, add_special_tokens=False).ids
        return [int(i) for i in ids[:MAX_PIECES_PER_WORD]] or [self.unk_id]


@dataclass(frozen=True)
class EncodedChunks:
    """All chunks of a dataset as fixed-length LayoutLMv3 inputs.

    Attributes:
        input_ids, attention_mask, labels: [n, max_seq_len] int64 (labels -100 where ignored).
        bbox: [n, max_seq_len, 4] int64.
        document: [n] each chunk's document index.
        subject: [n] each chunk's privacy-unit index (dense, < num_subjects).
        num_subjects: the dataset's number of privacy units.
        word_index: [n, max_seq_len] the word (within its document) a labelled token
            starts, -1 elsewhere (for word-level predictions).
    """

    input_ids: torch.Tensor
    bbox: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    document: torch.Tensor
    subject: torch.Tensor
    num_subjects: int
    word_index: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def chunks_per_subject(self) -> torch.Tensor:
        """[num_subjects] how many chunks each unit has."""
        return torch.bincount(self.subject, minlength=self.num_subjects)


def _document_chunks(doc: KieDocument, tok: WordTokenizer,
                     window: int) -> list[list[tuple[int, int, int]]]:
    """Cut ``doc`` into lists of (token id, word index, label) of at most ``window``."""
    chunks: list[list[tuple[int, int, int]]] = [[]]
    for w, word in enumerate(doc.words):
        ids = tok.pieces(word)[:window]
        if len(chunks[-1]) + len(ids) > window:
            chunks.append([])
        chunks[-1].extend((t, w, doc.labels[w] if k == 0 else IGNORE)
                          for k, t in enumerate(ids))
    return chunks


def encode_documents(dataset: KieDataset, tokenizer: WordTokenizer,
                     max_seq_len: int) -> EncodedChunks:
    """Tokenize and chunk every document of ``dataset`` (see the module docstring).

    Raises:
        ValueError: if ``max_seq_len < 3``.
    """
    if max_seq_len < 3:
        raise ValueError("max_seq_len must be >= 3 (CLS, one token, SEP)")
    rows: list[tuple[int, list[tuple[int, int, int]]]] = []
    for d, doc in enumerate(dataset.documents):
        rows.extend((d, chunk) for chunk in _document_chunks(doc, tokenizer, max_seq_len - 2))
    n = len(rows)
    input_ids = torch.full((n, max_seq_len), tokenizer.pad_id, dtype=torch.long)
    labels = torch.full((n, max_seq_len), IGNORE, dtype=torch.long)
    word_index = torch.full((n, max_seq_len), -1, dtype=torch.long)
    bbox = torch.zeros((n, max_seq_len, 4), dtype=torch.long)
    mask = torch.zeros((n, max_seq_len), dtype=torch.long)
    document = torch.zeros(n, dtype=torch.long)
    for r, (d, chunk) in enumerate(rows):
        doc = dataset.documents[d]
        document[r] = d
        length = len(chunk) + 2
        input_ids[r, 0], input_ids[r, length - 1] = tokenizer.cls_id, tokenizer.sep_id
        mask[r, :length] = 1
        if chunk:
            ids, words, labs = (torch.tensor(c, dtype=torch.long) for c in zip(*chunk,
                                                                               strict=True))
            input_ids[r, 1:length - 1] = ids
            labels[r, 1:length - 1] = labs
            word_index[r, 1:length - 1] = torch.where(labs != IGNORE, words, -1)
            bbox[r, 1:length - 1] = torch.tensor(doc.boxes, dtype=torch.long)[words]
    subject = torch.as_tensor(np.asarray(dataset.subjects), dtype=torch.long)[document]
    return EncodedChunks(input_ids, bbox, mask, labels, document, subject,
                         dataset.num_subjects, word_index)
