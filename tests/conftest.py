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
