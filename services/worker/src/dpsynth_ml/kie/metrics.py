"""KIE evaluation: word-level predictions, token-level and entity-level (BIO span) F1.

Entity F1 follows seqeval's default (conlleval) reading of IOB2 tags, written here because
seqeval is not a dependency: an entity starts at ``B-X``, or at ``I-X`` after ``O`` or after
a tag of another type, and runs over the following ``I-X``; a predicted entity is correct
when its type, start and end all match a true one. Micro-averaged over all documents.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dpsynth_ml.kie.data import KieDataset
from dpsynth_ml.kie.model import KieModel
from dpsynth_ml.kie.tokenize import EncodedChunks

Entity = tuple[int, str, int, int]


def _split(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BI":
        return tag[0], tag[2:]
    return "I", tag  # an untyped-prefix tag: one entity per run of it


def bio_entities(tags: Sequence[str], sequence: int = 0) -> set[Entity]:
    """The (sequence, type, start, end-exclusive) entities of one tag sequence."""
    out: set[Entity] = set()
    start, kind = -1, ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, typ = _split(tag)
        begins = prefix == "B" or (prefix == "I" and typ != kind)
        if start >= 0 and (prefix == "O" or begins):
            out.add((sequence, kind, start, i))
            start, kind = -1, ""
        if prefix != "O" and begins:
            start, kind = i, typ
    return out


def _prf(correct: int, predicted: int, true: int) -> dict[str, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "correct": float(correct),
            "predicted": float(predicted), "true": float(true)}


def _check(true: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> None:
    if len(true) != len(pred) or any(len(t) != len(p) for t, p in zip(true, pred,
                                                                        strict=False)):
        raise ValueError("true and predicted tags must have the same shape")


def entity_f1(true: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision/recall/F1 over BIO entities (exact type and span match)."""
    _check(true, pred)
    gold: set[Entity] = set()
    guess: set[Entity] = set()
    for s, (t, p) in enumerate(zip(true, pred, strict=True)):
        gold |= bio_entities(t, s)
        guess |= bio_entities(p, s)
    return _prf(len(gold & guess), len(guess), len(gold))


def token_f1(true: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
             outside: str = "O") -> dict[str, float]:
    """Micro precision/recall/F1 over non-``outside`` word tags, plus plain accuracy."""
    _check(true, pred)
    correct = predicted = gold = same = total = 0
    for t_seq, p_seq in zip(true, pred, strict=True):
        for t, p in zip(t_seq, p_seq, strict=True):
            total += 1
            same += t == p
            predicted += p != outside
            gold += t != outside
            correct += t == p and t != outside
    return {**_prf(correct, predicted, gold), "accuracy": same / total if total else 0.0}


@torch.no_grad()
def predict_words(kie: KieModel, chunks: EncodedChunks, *,
                  batch_size: int = 32) -> dict[int, list[int]]:
    """Each document's predicted label per word (argmax at the word's first sub-token)."""
    model = kie.model
    was_training = model.training
    model.train(False)
    device = next(model.parameters()).device
    out: dict[int, dict[int, int]] = {}
    try:
        for start in range(0, len(chunks), batch_size):
            sl = slice(start, start + batch_size)
            logits = model(input_ids=chunks.input_ids[sl].to(device),
                           bbox=chunks.bbox[sl].to(device),
                           attention_mask=chunks.attention_mask[sl].to(device)).logits
            best = logits.argmax(-1).cpu()
            for r in range(best.shape[0]):
                doc = int(chunks.document[start + r])
                words = chunks.word_index[start + r]
                at = (words >= 0).nonzero().flatten()
                out.setdefault(doc, {}).update(zip(words[at].tolist(), best[r, at].tolist(),
                                                   strict=True))
    finally:
        model.train(was_training)
    return {d: [w[i] for i in range(len(w))] for d, w in out.items()}


def evaluate_kie(kie: KieModel, dataset: KieDataset,
                 chunks: EncodedChunks) -> dict[str, float]:
    """Token-level and entity-level F1 of ``kie`` on held-out ``dataset`` (whose chunks are
    ``chunks``). Keys: ``token_*``, ``entity_*`` and ``documents``."""
    names = kie.label_names
    predictions = predict_words(kie, chunks)
    true, pred = [], []
    for d, doc in enumerate(dataset.documents):
        true.append([dataset.label_names[x] for x in doc.labels])
        pred.append([names[x] for x in predictions.get(d, [0] * len(doc.labels))])
    tokens = {f"token_{k}": v for k, v in token_f1(true, pred).items()}
    entities = {f"entity_{k}": v for k, v in entity_f1(true, pred).items()}
    return {**tokens, **entities, "documents": float(len(true))}
