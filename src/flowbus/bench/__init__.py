"""flowbus benchmarks: each module has a ``run(...) -> dict`` whose result is printed as JSON."""
