"""One-question probes behind the design pages: ``python -m benchmarks.probes.<module> [args]``."""
