"""Measure candidate tile configurations of minitensor's matrix product on the GPU and print, per (precision
class, size class), the fastest: the table `_CONFIGS` in kernels/matmul_plans.py is copied from this output.

`python -m bench.matmul_tune [--quick] [--only PRECISION]`. Each candidate is (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
num_warps, num_stages) for the classic kernel and for float32 IEEE products also for matmul_fma.py's Gluon kernel
(`_FMA_CONFIGS`, num_stages being its STAGES), with SUBTILE for the persistent TMA kernel (`_TMA_CONFIGS`), timed
with CUDA events (bench.matmul.warmed_device_seconds) on a representative shape of its size class, each kernel
alone; a candidate that fails to compile or launch (too much shared memory) is skipped.
"""
import argparse

import minitensor as mt
from bench import frameworks
from bench.matmul import warmed_device_seconds
from bench.table import table
from minitensor.kernels import matmul_plans
from minitensor.ops import matmul as products

SHAPES = {"small": (384, 384, 384), "medium": (1024, 1024, 1024), "large": (8192, 8192, 8192)}
DTYPES = {"half": mt.bfloat16, "tf32": mt.float32, "ieee": mt.float32, "double": mt.float64}
CANDIDATES = {
    "half": [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (256, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4),
             (128, 128, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4), (64, 64, 64, 8, 4, 4), (128, 128, 128, 8, 8, 3)],
    "tf32": [(128, 256, 32, 8, 8, 3), (128, 128, 32, 8, 8, 4), (128, 128, 32, 8, 4, 4), (64, 128, 32, 8, 4, 4),
             (128, 64, 32, 8, 4, 4), (64, 64, 32, 8, 4, 4), (128, 256, 16, 8, 8, 4)],
    "ieee": [(128, 128, 32, 8, 8, 3), (64, 128, 32, 8, 4, 3), (128, 64, 16, 8, 4, 3), (64, 64, 32, 8, 4, 3),
             (64, 64, 16, 8, 4, 3), (32, 64, 32, 8, 4, 3), (32, 32, 32, 8, 4, 2), (128, 128, 16, 8, 8, 4),
             (128, 64, 32, 8, 8, 3), (64, 128, 32, 8, 8, 3), (128, 128, 8, 8, 8, 4), (256, 64, 16, 8, 8, 3),
             (64, 128, 16, 8, 4, 4), (128, 64, 32, 8, 4, 4)],
    "double": [(64, 64, 32, 8, 4, 3), (64, 64, 16, 8, 4, 3), (32, 64, 32, 8, 4, 3), (32, 32, 32, 8, 4, 3),
               (64, 128, 16, 8, 8, 3)],
}
# the persistent TMA kernel's (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, SUBTILE), for
# matmul_plans._TMA_CONFIGS: a class whose best TMA candidate beats the best of CANDIDATES belongs there
TMA_CANDIDATES = {
    "half": [(128, 256, 64, 8, 8, 3, 1), (128, 256, 64, 8, 8, 3, 2), (128, 256, 64, 8, 8, 4, 2),
             (256, 128, 64, 8, 8, 3, 2), (256, 128, 64, 8, 8, 4, 2), (128, 128, 64, 8, 8, 4, 1),
             (128, 128, 64, 8, 4, 4, 2), (64, 128, 64, 8, 4, 4, 1)],
    "tf32": [(128, 256, 32, 8, 8, 3, 2), (256, 128, 32, 8, 8, 3, 2), (128, 128, 32, 8, 8, 4, 1),
             (128, 128, 32, 8, 8, 4, 2), (128, 128, 32, 8, 4, 4, 2), (64, 128, 32, 8, 4, 4, 1)],
    "ieee": [(64, 128, 32, 8, 4, 3, 1), (128, 128, 32, 8, 8, 3, 1), (64, 64, 32, 8, 4, 3, 1),
             (128, 64, 32, 8, 4, 3, 1), (128, 128, 16, 8, 8, 4, 1), (64, 128, 16, 8, 4, 4, 1)],
}

# matmul_fma.py's Gluon kernel for float32 in IEEE arithmetic, for matmul_plans._FMA_CONFIGS
FMA_CANDIDATES = {
    "ieee": [(256, 128, 32, 8, 8, 3), (256, 128, 32, 8, 8, 4), (256, 128, 16, 8, 8, 4), (128, 256, 32, 8, 8, 3),
             (128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 2), (128, 128, 32, 8, 8, 3), (128, 64, 64, 8, 8, 3),
             (64, 64, 64, 8, 4, 3), (64, 64, 32, 8, 4, 3), (64, 64, 64, 8, 4, 4), (64, 64, 32, 8, 4, 4)],
}
# each alternative kernel's table in matmul_plans and its candidates: the plans take one listed there first
ALTERNATIVES = {"TMA": (matmul_plans._TMA_CONFIGS, TMA_CANDIDATES), "FMA": (matmul_plans._FMA_CONFIGS, FMA_CANDIDATES)}


def _time_candidates(table, key, candidates, product, flops):
    """[(TFLOP/s, config)] of `product` with each candidate in matmul_plans' `table` at `key`."""
    results = []
    for config in candidates:
        table[key] = config
        matmul_plans.matmul_plan.cache_clear()
        products._fast.clear()
        try:
            results.append((flops / warmed_device_seconds(product, frameworks.minitensor(), 10) / 1e12, config))
        except Exception as exc:  # a configuration past the shared memory: not a candidate
            print(f"  {key} {config}: {type(exc).__name__}: {str(exc)[:80]}")
    return results


def tune(precision, size):
    m, n, k = SHAPES[size]
    mt.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    a = mt.randn(m, k, device="cuda").to(DTYPES[precision])
    b = mt.randn(k, n, device="cuda").to(DTYPES[precision])
    key, flops = (precision, size), 2 * m * n * k
    saved = {name: configs.pop(key, None) for name, (configs, _) in ALTERNATIVES.items()}  # the classic kernel first
    timed = [_time_candidates(matmul_plans._CONFIGS, key, CANDIDATES[precision], lambda: a @ b, flops)]
    for configs, candidates in ALTERNATIVES.values():  # then each alternative alone
        timed.append(_time_candidates(configs, key, candidates.get(precision, []), lambda: a @ b, flops))
        configs.pop(key, None)
    for name, (configs, _) in ALTERNATIVES.items():
        if saved[name] is not None:
            configs[key] = saved[name]
    mt.backends.cuda.matmul.allow_tf32 = False
    bests = [max(results, default=(0.0, None)) for results in timed]
    return (precision, size, f"{m}x{n}x{k}", *(f"{best[1]} {best[0]:.1f}" for best in bests),
            " ".join(f"{t:.0f}" for results in timed for t, _ in results))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the large size class")
    parser.add_argument("--only", choices=list(CANDIDATES), help="only this precision class")
    args = parser.parse_args()
    if mt.cuda.backend() != "nvidia":
        raise SystemExit("bench.matmul_tune measures a GPU")
    sizes = ["large"] if args.quick else list(SHAPES)
    rows = [tune(precision, size) for precision in ([args.only] if args.only else CANDIDATES) for size in sizes]
    print(table(("precision", "size", "shape", "best config, TFLOP/s", *(f"best {name} config, TFLOP/s"
                 for name in ALTERNATIVES), "all candidates' TFLOP/s"), rows))


if __name__ == "__main__":
    main()
