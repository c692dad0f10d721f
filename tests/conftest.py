"""Tests are written once against "cuda": on CI that is the simulated device, on the GPU machine the H100.

With no MINITENSOR_BACKEND set, a machine without a GPU uses the simulator; say so once, not per test.
"""
import faulthandler
import gc
import os

import pytest

import minitensor as mt

DEVICES = ["cpu", "cuda"]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def flags():
    """The matmul flags as they were, restored after the test."""
    m = mt.backends.cuda.matmul
    saved = (mt.get_float32_matmul_precision(), m.fp32_precision, m.allow_fp16_reduced_precision_reduction,
             m.allow_fp16_reduced_precision_reduction_split_k, m.allow_bf16_reduced_precision_reduction,
             m.allow_bf16_reduced_precision_reduction_split_k, m.allow_fp16_accumulation)
    yield m
    mt.set_float32_matmul_precision(saved[0])
    m.fp32_precision = saved[1]
    m.allow_fp16_reduced_precision_reduction = saved[2:4]
    m.allow_bf16_reduced_precision_reduction = saved[4:6]
    m.allow_fp16_accumulation = saved[6]
    mt.backends.cuda.preferred_blas_library("default")


@pytest.fixture
def clean_cuda_state():
    """Each test starts with an idle device and an empty cache, and ends with the default stream current."""
    gc.collect()
    mt.cuda.synchronize()
    mt.cuda.empty_cache()
    yield
    try:
        mt.cuda.set_device(0)
        mt.cuda.set_stream(mt.cuda.default_stream())
    finally:
        gc.collect()
        mt.cuda.synchronize()
        mt.cuda.empty_cache()


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:minitensor. no usable NVIDIA GPU")


def pytest_report_header(config):
    return f"minitensor backend: {mt.cuda.backend()} ({mt.cuda.get_device_name()})"


def pytest_sessionfinish(session):
    """With MINITENSOR_EXIT_WATCHDOG=<file>: a test process still alive 120 s after its tests end (a stream
    left blocked, a thread that never ends) appends every thread's stack to the file and exits, so a hang at
    exit shows where it is instead of eating the run's time limit."""
    path = os.environ.get("MINITENSOR_EXIT_WATCHDOG")
    if path:
        faulthandler.dump_traceback_later(120, exit=True, file=open(path, "a"))
