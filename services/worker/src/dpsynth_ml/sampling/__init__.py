"""The sampling room: generating synthetic corpora and layout masks from a model."""
