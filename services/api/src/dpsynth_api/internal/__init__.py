"""Internal endpoints for workers (``/internal/v1``, worker token)."""
