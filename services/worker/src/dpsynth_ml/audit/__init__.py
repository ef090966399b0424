"""Empirical privacy audits (issue 19): measured LOWER bounds on the epsilon a training
configuration really has, beside the accountant's upper bound.

:mod:`~dpsynth_ml.audit.one_run` holds the statistics of the one-run audit (Steinke, Nasr
and Jagielski, NeurIPS 2023): the p-value of a count of correct membership guesses under an
(eps, delta) claim, the bound it gives, and the guesses pre-registered for m canaries.
:mod:`~dpsynth_ml.audit.gdp` is the f-DP one-run analysis against a claim's GDP envelope
(tighter on Gaussian mechanisms; the envelope comes from the ledger).
:mod:`~dpsynth_ml.audit.whitebox` runs white-box gradient (Dirac) canaries through a DP-SGD
engine; :mod:`~dpsynth_ml.audit.finetune` does it inside a finetune's own steps on a public
stand-in. :mod:`~dpsynth_ml.audit.blackbox` is the black-box audit: noise-image loss
canaries (records, or whole subjects of a subject-level run: :mod:`~dpsynth_ml.audit.canary_sets`)
trained on beside the stand-in and scored on the finished model (docs/privacy.md,
"Empirical audits").
"""
