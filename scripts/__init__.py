"""Developer scripts (profiling, tracing, generation benchmarks): not part of the product packages;
run from the repository root as `python -m scripts.<name>`."""
