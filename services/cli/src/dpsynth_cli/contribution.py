"""The private data's contribution to a downstream classifier (``make demo``, issue 18).

Two corpora are made with the same generate settings: one by the DP-finetuned model, one by
the PUBLIC base model it was finetuned from (no private data). The same classifier protocol
is trained on each and tested on the SAME real held-out records of the private dataset, so
the two accuracies are two estimates p1 (public only) and p2 (DP finetuned) over the same n
test records. The contribution is ``difference = p2 - p1`` with the standard error

    SE = sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n)

(the binomial standard errors of two independent proportions, combined). The two estimates
share their test records, which in practice correlates them positively; ignoring that
correlation overstates the SE of the difference, so the check below is conservative. The
private data is taken to have helped when ``difference >= 2 SE`` (about a one-sided 2.3%
test under the normal approximation).

Pure Python (no numpy): the demo, its tests and anything else can import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

CLASSIFIER = "cnn"
"""The classifier kind the comparison uses for both corpora, fixed in advance: the
evaluation's CNN (``EvaluateSpec.classifiers``; its strongest on digits, the demo's headline)."""
MIN_STANDARD_ERRORS = 2.0
"""The contribution counts as shown when the DP-finetuned accuracy exceeds the public-only
one by at least this many standard errors of the difference."""


def difference_standard_error(p1: float, p2: float, n: int) -> float:
    """sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n): the standard error of ``p2 - p1`` for two
    accuracies each measured on ``n`` test records (treated as independent).

    Raises:
        ValueError: ``n`` below 1 or an accuracy outside [0, 1].
    """
    if n < 1:
        raise ValueError(f"n must be a positive number of test records, not {n}")
    for p in (p1, p2):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"an accuracy must lie in [0, 1], not {p}")
    return math.sqrt(p1 * (1.0 - p1) / n + p2 * (1.0 - p2) / n)


def private_contribution(public_only_accuracy: float, dp_finetuned_accuracy: float, *,
                         n_test: int, epsilon: float) -> dict[str, float | int]:
    """The summary's ``private_contribution``: both accuracies, the epsilon the DP finetune's
    guarantee states, the test size, the standard error and the difference (DP finetuned
    minus public only)."""
    se = difference_standard_error(public_only_accuracy, dp_finetuned_accuracy, n_test)
    return {"public_only_accuracy": float(public_only_accuracy),
            "dp_finetuned_accuracy": float(dp_finetuned_accuracy),
            "epsilon": float(epsilon), "n_test": int(n_test), "standard_error": se,
            "difference": float(dp_finetuned_accuracy) - float(public_only_accuracy)}


def contribution_shown(contribution: Mapping[str, float | int], *,
                       k: float = MIN_STANDARD_ERRORS) -> bool:
    """Whether the DP-finetuned accuracy is above the public-only one by at least ``k``
    standard errors of the difference (a zero SE needs a strictly positive difference)."""
    difference = float(contribution["difference"])
    return difference > 0.0 and difference >= k * float(contribution["standard_error"])


def contribution_from_reports(public_only_report: Mapping[str, Any],
                              dp_finetuned_report: Mapping[str, Any], *,
                              classifier: str, epsilon: float) -> dict[str, float | int]:
    """``private_contribution`` from two evaluate reports (``GET /v1/jobs/{id}/report``):
    the ``classifier``'s TSTR accuracy of each, tested on the same held-out records.

    Raises:
        ValueError: the reports were tested on held-out sets of different sizes (not the
            same dataset's held-out records), or one lacks the classifier.
    """
    sizes = [(r.get("sizes") or {}).get("real_holdout")
             for r in (public_only_report, dp_finetuned_report)]
    if sizes[0] != sizes[1] or not sizes[0]:
        raise ValueError(f"the two evaluations were tested on different held-out sets "
                         f"({sizes[0]} vs {sizes[1]} records)")
    accuracies = []
    for name, report in (("public-only", public_only_report),
                         ("DP-finetuned", dp_finetuned_report)):
        tstr = (report.get("headline") or {}).get("tstr_accuracy") or {}
        if classifier not in tstr:
            raise ValueError(f"the {name} evaluation has no {classifier!r} classifier")
        accuracies.append(float(tstr[classifier]))
    return private_contribution(accuracies[0], accuracies[1], n_test=int(sizes[0]),
                                epsilon=epsilon)
