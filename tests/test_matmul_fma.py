"""The Gluon kernel for large float32 products in IEEE arithmetic (kernels/matmul_fma.py).

The simulator's interpreter cannot run Gluon, so there the products themselves are covered by test_matmul.py's
kernel; here the kernel is compiled for Hopper with every admitted Triton (it needs no GPU) and its machine code
checked for what its speed rests on, and on a GPU its products are checked against numpy."""
import dataclasses
import re
import subprocess
import types

import pytest
import triton.knobs

import minitensor as mt
from minitensor.kernels import compat, launcher, matmul_fma, matmul_plans

from test_matmul import check, random, replay_with_new_input, spied_plans

GPU = mt.cuda.backend() == "nvidia"
on_gpu = pytest.mark.skipif(not GPU, reason="the interpreter cannot run Gluon: see the compile test")
CONFIG, MEDIUM_CONFIG = matmul_plans._FMA_CONFIGS[("ieee", "large")], matmul_plans._FMA_CONFIGS[("ieee", "medium")]
# (m, k, n) of the "large" size class, ending in partial tiles (and a partial K step), multiples of 16 as the
# strides of transposed operands must be; EVEN_SHAPE fills whole tiles
SHAPE, EVEN_SHAPE = (2064, 528, 2080), (2048, 512, 2048)
LAYOUTS = ["nn", "tn", "nt", "tt"]  # 't': that operand is stored transposed (A M-contiguous, B K-contiguous)
TYPES = ("*fp32", "*fp32", "*fp32", "*fp32") + ("i32",) * 15 + ("fp32", "fp32")


def _sass(tmp_path, layout, even, bias=False, config=CONFIG):
    """The kernel compiled for an H100 through minitensor's own compile path, disassembled; all int parameters
    multiples of 16, as _fma_plan passes them for a single aligned product."""
    block_m, block_n, block_k, group_m, num_warps, stages = config
    constexprs = (block_m, block_n, block_k, group_m, stages, bias, bias, layout[0] == "n", layout[1] == "t", True,
                  even)
    signature, values = launcher._signature(matmul_fma.matmul_fma, TYPES, constexprs)
    compiled = compat.compile_cuda(matmul_fma.matmul_fma, signature, values, tuple(range(19)), 90, num_warps, stages)
    assert compiled["shared"] == matmul_plans.fma_shared_bytes(config)  # what _fma_readable asks of the device
    cubin = tmp_path / "matmul_fma.cubin"
    cubin.write_bytes(compiled["cubin"])
    return subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout


def _main_loop(sass):
    """The instructions of the K loop: those from the target of the longest backward branch to the branch."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    address = [int(at, 16) for at, _ in lines]
    branches = [(int(target, 16), at) for at, (_, text) in zip(address, lines)
                for target in re.findall(r"\bBRA\s+(0x[0-9a-f]+)", text) if int(target, 16) < at]
    start, end = max(branches, key=lambda branch: branch[1] - branch[0])
    return [text for at, (_, text) in zip(address, lines) if start <= at <= end]


def _check_machine_code(sass, config):
    """In the K loop: copies from global to shared memory in 16-byte pieces; shared memory read 16 bytes at a time,
    each thread reading each of its A and B values once per k (for its rows x cols block of C in matmul_fma's
    accumulator layout, rows + cols reads to 4 * rows * cols FMAs per 4 k); no local memory stores, and at most
    one local load per 1024 FMAs (a spilled accumulator or operand would need one every few FMAs)."""
    block_m, block_n, _, _, num_warps, _ = config
    rows, cols = block_m // (2 * num_warps), block_n // 16
    loop = " ;\n".join(_main_loop(sass))
    ffma, lds128 = len(re.findall(r"\bFFMA\b", loop)), len(re.findall(r"\bLDS\.128\b", loop))
    assert re.search(r"\bLDGSTS\.E\.BYPASS\.128\b", loop) and not re.search(r"\bLDGSTS\.E(\.BYPASS)? ", loop)
    assert lds128 and ffma * (rows + cols) == 4 * rows * cols * lds128
    assert not re.search(r"\bSTL\b", loop) and 1024 * len(re.findall(r"\bLDL\b", loop)) <= ffma


@pytest.mark.parametrize("even", [True, False], ids=["even", "edges"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_compiles_for_hopper_in_every_layout(tmp_path, layout, even):
    _check_machine_code(_sass(tmp_path, layout, even), CONFIG)


def test_compiles_with_bias_and_alpha_and_for_medium_products(tmp_path):
    _check_machine_code(_sass(tmp_path, "nn", False, bias=True), CONFIG)
    _check_machine_code(_sass(tmp_path, "nt", False, config=MEDIUM_CONFIG), MEDIUM_CONFIG)


@pytest.fixture
def fma_plans(monkeypatch):
    """The FMA plans built during the test."""
    yield from spied_plans(monkeypatch, "_fma_plan")


def _stored(t, transposed):
    """t's values, laid out with its last two dims swapped in memory when `transposed`."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2) if transposed else t


@on_gpu
@pytest.mark.parametrize("shape", [SHAPE, EVEN_SHAPE], ids=["edges", "even"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_in_ieee_precision(flags, fma_plans, layout, shape):
    flags.allow_tf32 = False
    m, k, n = shape
    a = _stored(random((m, k), mt.float32, "cuda", 60), layout[0] == "t")
    b = _stored(random((k, n), mt.float32, "cuda", 61), layout[1] == "t")
    check(a @ b, a, b, mt.float32)  # IEEE-sized errors: a tf32 product would miss this bound by 100x
    assert len(fma_plans) == 1


@on_gpu
def test_batches_bias_alpha_and_beta(flags, fma_plans):
    flags.allow_tf32 = False
    m, k, n = SHAPE
    a, b = random((3, m, k), mt.float32, "cuda", 62), _stored(random((3, k, n), mt.float32, "cuda", 63), True)
    bias = random((n,), mt.float32, "cuda", 64)
    check(mt.baddbmm(bias, a, b, beta=0.5, alpha=-1.5), a, b, mt.float32, bias=bias, alpha=-1.5, beta=0.5)
    assert len(fma_plans) == 1


@on_gpu
@pytest.mark.parametrize("k", [0, 16, 48])
def test_short_and_empty_k(flags, fma_plans, k):
    """Fewer K steps than pipeline stages, and none at all (C = beta * bias: no product to launch)."""
    flags.allow_tf32 = False
    m, n = 520, 528
    a, b, bias = (random(shape, mt.float32, "cuda", 68 + k) for shape in ((m, k), (k, n), (m, n)))
    check(mt.addmm(bias, a, b, beta=0.25), a, b, mt.float32, bias=bias, beta=0.25)
    assert len(fma_plans) == (k > 0)


@on_gpu
def test_unaligned_strides_take_the_classic_kernel(flags, fma_plans):
    """An operand whose rows do not start on 16 bytes cannot be copied in 16-byte pieces."""
    flags.allow_tf32 = False
    m, k, n = SHAPE
    a = random((m, k + 1), mt.float32, "cuda", 65)[:, :k]
    b = random((k, n), mt.float32, "cuda", 66)
    check(a @ b, a, b, mt.float32)
    assert not fma_plans


@on_gpu
def test_a_gpu_with_less_shared_memory_takes_the_classic_kernel(flags, fma_plans, monkeypatch):
    """A GeForce offers a block 99 KiB of shared memory, less than the configuration's stages take."""
    flags.allow_tf32 = False
    driver = matmul_plans.active_driver()
    small = dataclasses.replace(driver.properties(0), shared_memory_per_block_optin=99 * 1024)
    assert small.shared_memory_per_block_optin < matmul_plans.fma_shared_bytes(CONFIG)
    monkeypatch.setattr(matmul_plans, "active_driver", lambda: types.SimpleNamespace(properties=lambda device: small))
    m, k, n = SHAPE
    a, b = random((m, k), mt.float32, "cuda", 69), random((k, n), mt.float32, "cuda", 70)
    check(a @ b, a, b, mt.float32)
    assert not fma_plans


@on_gpu
def test_in_a_cuda_graph(flags, fma_plans):
    flags.allow_tf32 = False
    m, k, n = SHAPE
    replay_with_new_input((m, k), (k, n), mt.float32, 67)
    assert fma_plans
