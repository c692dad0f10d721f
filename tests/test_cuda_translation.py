"""The simulator's translation of users' CUDA C++ launches (`kernel<<<grid, block>>>(args)`) for the CPU
emulation: one pass over the source, linear in its length, and a CompileError naming the line of a `<<<` that no
`>>>` closes (each `<<<` used to be scanned to the end of the source: 48 KB of them took 16 s)."""
import ctypes
import sys
import time

import pytest

from minitensor.base.errors import CompileError
from minitensor.kernels import cuda_emulation as ce


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITENSOR_CACHE_DIR", str(tmp_path))


LAUNCH_UNIT = r"""
__global__ void scale_%d(float *y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] *= 2; }
extern "C" void launch_%d(float *y, int n, cudaStream_t s) { scale_%d<<<dim3((n + 255) / 256), 256, 0, s>>>(y, n); }
"""
UNCLOSED_UNIT = "  scale<<<(n), 256>(y, n);\n"  # a `>` short: no `>>>` closes any of them


def launches(size):
    """A source of at least `size` bytes: kernels, each with a host function launching it."""
    count = size // len(LAUNCH_UNIT % (0, 0, 0)) + 1
    return "".join(LAUNCH_UNIT % (i, i, i) for i in range(count))


def unclosed(size):
    """A host function of at least `size` bytes of launches that no `>>>` closes."""
    return "void host(float *y, int n) {\n" + UNCLOSED_UNIT * (size // len(UNCLOSED_UNIT) + 1) + "}\n"


def lines_run(source):
    """How many Python lines translate(source) runs, through to its error if any: a measure of its work that
    does not depend on the machine's speed or load."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += event == "line"
        return trace
    previous = sys.gettrace()  # a coverage tool's, put back after
    sys.settrace(trace)
    try:
        ce.translate(source)
    except CompileError:
        pass
    finally:
        sys.settrace(previous)
    return count


@pytest.mark.parametrize("make", [launches, unclosed])
def test_translation_work_is_linear_in_the_source(make):
    """Twice the source, about twice the work (the scans from each `<<<` made it four times)."""
    small, large = lines_run(make(48 * 1024)), lines_run(make(96 * 1024))
    assert large < 2.5 * small, (small, large)


def test_a_large_source_translates_at_once():
    source = launches(48 * 1024)
    start = time.perf_counter()
    translated = ce.translate(source)
    assert translated.count("::__mt_emu::launch(") == source.count("<<<") > 150
    assert translated.count("\n") == source.count("\n")
    with pytest.raises(CompileError):
        ce.translate(unclosed(48 * 1024))
    assert time.perf_counter() - start < 2  # generous: about 0.05 s; 16 s before


@pytest.mark.parametrize("host, line", [
    ("  k<<<1, 1>>>(x);\n  k<<<1, 1(x);\n", 6),  # the function ends first
    ("  k<<<1, 1>>>(x);\n  f(k<<<1, 1)(x);\n  k<<<1, 1>>>(x);\n", 6),  # a bracket opened before it closes first
    ("  k<<<(1, 1>>>(x);\n  k<<<1, 1>>>(x);\n", 5),  # one opened after it is never closed
])
def test_an_unclosed_launch_is_a_compile_error_naming_its_line(host, line):
    source = f"__global__ void k(float *x) {{}}\nvoid f(int);\n\nvoid host(float *x) {{\n{host}}}\n"
    for build in (ce.translate, ce.emulated_library):
        with pytest.raises(CompileError) as info:
            build(source)
        message = "this kernel launch's '<<<' is not closed by '>>>' (a launch is kernel<<<grid, block>>>(arguments))"
        assert info.value.lines == [(line, "error", message)]
        assert f"line {line}: this kernel launch's '<<<' is not closed" in str(info.value)


def test_a_template_operator_shift_is_not_a_launch():
    source = ("template <typename T> struct Box { T v; };\n"
              "template <typename T> int operator<<(Box<T> b, int s) { return b.v << s; }\n"
              "int shifted(Box<int> b) { return operator<<<int>(b, 2) + operator << <int>(b, 1); }\n")
    assert ce.translate(source) == source
    assert ctypes.CDLL(ce.emulated_library(source))
