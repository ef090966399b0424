"""Artifacts: job outputs (models, checkpoints, corpora, owner-only private statistics)."""
