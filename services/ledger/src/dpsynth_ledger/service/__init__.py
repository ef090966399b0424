"""Use cases of the ledger (keyword-only; each commits once)."""
