"""The parallel room: where a job runs (``placement``), the rank processes (``ranks``) and
the process-group helpers they share (``distributed``)."""
