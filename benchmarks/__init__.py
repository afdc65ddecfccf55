"""The GPU benchmarks of liger_registry: ``python -m benchmarks <name> [args]`` from the repository root."""
