"""Tests are written once against "cuda": on CI that is the simulated device, on the GPU machine the H100.

With no MINITENSOR_BACKEND set, a machine without a GPU uses the simulator; say so once, not per test.
"""
import pytest

import minitensor as mt

DEVICES = ["cpu", "cuda"]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:minitensor. no usable NVIDIA GPU")


def pytest_report_header(config):
    return f"minitensor backend: {mt.cuda.backend()} ({mt.cuda.get_device_name()})"
