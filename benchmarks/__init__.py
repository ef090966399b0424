"""dpsynth benchmarks: run with ``make bench`` or ``python -m benchmarks.<name>``; see README.md."""
