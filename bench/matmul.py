"""Matrix products: minitensor's Triton kernels against torch's cuBLAS, measured in the same run.

`python -m bench.matmul [--quick]` prints two tables:
- throughput: for each shape and dtype (bf16, fp16, fp32 with tf32, fp32 ieee), TFLOP/s of `a @ b` from CUDA
  events around back-to-back products (the best of a few repeats), minitensor's and torch's, and their ratio
  (the targets: >= 0.9 for bf16/fp16 and ieee fp32, >= 0.85 for tf32);
- small shapes: host microseconds per `a @ b` call (timing.host_us_per_call: the host's cost, the device never
  the bottleneck), minitensor's and torch's (the target: minitensor <= torch).
The GPU only: on the simulator there is nothing to measure.
"""
import argparse
import time

import minitensor as mt
from bench import frameworks
from bench.table import table
from bench.timing import device_s_per_launch, host_us_per_call

LARGE = [(4096, 4096, 4096), (8192, 8192, 8192)]
SMALL = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512)]
MODES = [("bf16", "bfloat16", False), ("fp16", "float16", False), ("fp32 tf32", "float32", True),
         ("fp32 ieee", "float32", False)]


def _operands(torch, m, n, k, dtype_name):
    a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype_name))
    b = torch.randn(k, n, device="cuda", dtype=getattr(torch, dtype_name))
    return a, b, mt.from_dlpack(a), mt.from_dlpack(b)


def warm_up(fn, synchronize, seconds=0.3):
    """Run `fn` for a while first: a GPU at idle clocks runs a short burst of products several times slower."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        synchronize()


def warmed_device_seconds(fn, fw, launches):
    """timing.device_s_per_launch (the best of three bursts between events), after a warm-up."""
    warm_up(fn, fw.synchronize)
    return device_s_per_launch(fn, fw, launches, 3)


def _set_tf32(torch, allowed):
    torch.backends.cuda.matmul.allow_tf32 = allowed
    mt.backends.cuda.matmul.allow_tf32 = allowed


def _product_seconds(torch_fw, m, n, k, dtype_name):
    """(minitensor's, torch's) seconds per product of the same operands."""
    a, b, ma, mb = _operands(torch_fw.module, m, n, k, dtype_name)
    launches = 5 if m >= 8192 else 20
    return (warmed_device_seconds(lambda: ma @ mb, frameworks.minitensor(), launches),
            warmed_device_seconds(lambda: a @ b, torch_fw, launches))


def throughput(torch_fw, quick):
    torch = torch_fw.module
    rows = []
    for (m, n, k) in LARGE[:1] if quick else LARGE:
        for label, dtype_name, tf32 in MODES:
            _set_tf32(torch, tf32)
            t_mt, t_torch = _product_seconds(torch_fw, m, n, k, dtype_name)
            flops = 2 * m * n * k
            rows.append((f"{m}x{n}x{k}", label, f"{flops / t_mt / 1e12:.1f}", f"{flops / t_torch / 1e12:.1f}",
                         f"{t_torch / t_mt:.2f}"))
    _set_tf32(torch, False)
    return table(("shape", "dtype", "minitensor TFLOP/s", "torch TFLOP/s", "mt/torch"), rows)


def host_time(torch_fw, quick):
    torch = torch_fw.module
    rows = []
    for (m, n, k) in SMALL:
        a, b, ma, mb = _operands(torch, m, n, k, "float32")
        setups = {"minitensor": lambda: ((lambda: ma @ mb), mt.cuda.synchronize),
                  "torch": lambda: ((lambda: a @ b), torch.cuda.synchronize)}
        times, errors = host_us_per_call(setups, 200, 5 if quick else 20)
        if errors:
            raise next(iter(errors.values()))
        rows.append((f"{m}x{n}x{k}", "fp32", f"{times['minitensor']:.2f}", f"{times['torch']:.2f}",
                     f"{times['minitensor'] / times['torch']:.2f}"))
    return table(("shape", "dtype", "minitensor us/call", "torch us/call", "mt/torch (<= 1)"), rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4096^3 only, fewer repeats")
    args = parser.parse_args()
    torch_fw = frameworks.torch_or_none()
    if mt.cuda.backend() != "nvidia" or torch_fw is None:
        raise SystemExit("bench.matmul compares with torch on a GPU: it needs both")
    print(host_time(torch_fw, args.quick))
    print()
    print(throughput(torch_fw, args.quick))


if __name__ == "__main__":
    main()
