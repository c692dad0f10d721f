"""Benchmarks for minitensor, side by side with torch and CuPy where they can run.

Run ``python -m bench --help``. Cases live in ``bench.cases`` (add one there), the
speed targets in ``bench.targets``. torch and CuPy are imported only here, never by
minitensor, and only used when a real CUDA GPU is present.
"""
