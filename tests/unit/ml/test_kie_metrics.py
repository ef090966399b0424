"""KIE metrics: seqeval-style entity F1 over BIO spans and token-level F1, by hand."""

from __future__ import annotations

import pytest
from dpsynth_ml.kie.metrics import bio_entities, entity_f1, token_f1

pytestmark = pytest.mark.unit


def test_bio_spans_follow_conlleval() -> None:
    tags = ["B-KEY", "I-KEY", "O", "I-VAL", "I-VAL", "B-VAL", "I-KEY", "B-KEY"]
    assert bio_entities(tags) == {(0, "KEY", 0, 2), (0, "VAL", 3, 5), (0, "VAL", 5, 6),
                                  (0, "KEY", 6, 7), (0, "KEY", 7, 8)}
    assert bio_entities(["O", "O"]) == set()


def test_entity_f1_by_hand() -> None:
    true = [["B-KEY", "I-KEY", "O", "B-VAL"], ["B-VAL", "O"]]
    pred = [["B-KEY", "I-KEY", "O", "O"], ["B-VAL", "B-KEY"]]
    scores = entity_f1(true, pred)
    # true: 3 entities; predicted: 3; correct: KEY[0:2] of doc 0 and VAL[0:1] of doc 1
    assert (scores["correct"], scores["predicted"], scores["true"]) == (2, 3, 3)
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3)
    # a span with the right type but a wrong end is wrong
    assert entity_f1([["B-KEY", "I-KEY"]], [["B-KEY", "O"]])["f1"] == 0.0
    assert entity_f1([["O"]], [["O"]])["f1"] == 0.0
    assert entity_f1(true, true)["f1"] == 1.0


def test_token_f1_by_hand() -> None:
    true = [["B-KEY", "I-KEY", "O", "B-VAL"]]
    pred = [["B-KEY", "O", "B-VAL", "B-VAL"]]
    scores = token_f1(true, pred)
    assert (scores["correct"], scores["predicted"], scores["true"]) == (2, 3, 3)
    assert scores["f1"] == pytest.approx(2 / 3) and scores["accuracy"] == 0.5


def test_shapes_must_match() -> None:
    with pytest.raises(ValueError, match="same shape"):
        entity_f1([["O"]], [["O", "O"]])
