"""Datasets: upload validation, canonical form, budgets registered with the ledger."""
