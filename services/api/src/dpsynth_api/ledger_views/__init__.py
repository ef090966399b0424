"""A private dataset's ledger history: export (JSON, CSV), verify and recompute reports."""
