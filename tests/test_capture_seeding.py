"""Seeding while a CUDA graph is being captured, as torch rules it (CUDAGeneratorImpl::set_current_seed): with the
current stream capturing, `manual_seed` may only repeat the generator's own seed, which changes nothing; another
seed raises RuntimeError and leaves every generator, the CPU's too, as it was. Seeding from another thread, or with
a side stream current, is not refused (torch asks CUDA about the current stream only). Before, every seed was
accepted silently, changing the state the captured random ops had been recorded against."""
import threading

import numpy as np
import pytest

import minitensor as mt

pytestmark = pytest.mark.usefixtures("clean_cuda_state")

MESSAGE = (r"CUDAGeneratorImpl::set_current_seed can be called during stream capture only if new seed is the same "
           r"as the original seed\.")
SEEDERS = {"mt.manual_seed": mt.manual_seed, "mt.cuda.manual_seed": mt.cuda.manual_seed,
           "mt.cuda.manual_seed_all": mt.cuda.manual_seed_all}


def _state():
    g = mt.cuda.default_generators[mt.cuda.current_device()]
    return mt.initial_seed(), g.seed, g.offset


def _capture(body):
    """Capture `x + 1` and a random draw around `body()`; the graph, and what body returned."""
    x = mt.zeros(8, device="cuda")
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        y = x + 1
        r = mt.rand(8, device="cuda")
        result = body()
        z = y + r
    return g, z, result


@pytest.mark.parametrize("name", list(SEEDERS))
def test_a_new_seed_in_a_capture_raises_and_changes_nothing(name):
    seed = SEEDERS[name]
    mt.manual_seed(1234)
    mt.rand(3, device="cuda")  # an offset past 0, which a reseed would restart

    def body():
        before = _state()
        with pytest.raises(RuntimeError, match=MESSAGE):
            seed(99)
        with pytest.raises(RuntimeError, match=MESSAGE):
            seed(-1)  # 2**64 - 1: still another seed
        return before, _state()

    g, z, (before, after) = _capture(body)
    assert after == before and before[:2] == (1234, 1234)
    g.replay()
    assert np.all((z.cpu().numpy() >= 1) & (z.cpu().numpy() < 2))
    seed(99)  # once the capture is over
    assert mt.cuda.initial_seed() == 99


@pytest.mark.parametrize("name", list(SEEDERS))
def test_the_same_seed_in_a_capture_is_a_no_op(name):
    mt.manual_seed(77)
    mt.rand(5, device="cuda")

    def body():
        before = _state()
        SEEDERS[name](77)
        return before, _state()

    _, _, (before, after) = _capture(body)
    assert after == before, "the offset must not restart: the graph's draws were recorded against it"


def test_manual_seed_all_checks_every_device():
    """Refused as soon as one device's generator has another seed: no generator changes."""
    mt.manual_seed(5)
    mt.cuda.manual_seed(6)  # the current device's differs from the others' (when there are others)
    seeds = [mt.cuda.default_generators[i].seed for i in range(mt.cuda.device_count())]

    def body():
        with pytest.raises(RuntimeError, match=MESSAGE):
            mt.cuda.manual_seed_all(5 if mt.cuda.device_count() > 1 else 7)
        return [mt.cuda.default_generators[i].seed for i in range(mt.cuda.device_count())]

    assert _capture(body)[2] == seeds


def test_another_thread_or_a_side_stream_may_seed():
    mt.manual_seed(3)
    side = mt.cuda.Stream()
    seen = {}

    def other_thread():
        mt.cuda.manual_seed(41)
        seen["thread"] = mt.cuda.initial_seed()

    def body():
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        with mt.cuda.stream(side):  # not capturing: the current stream is what torch checks
            mt.cuda.manual_seed(42)
            seen["side"] = mt.cuda.initial_seed()

    _capture(body)
    assert seen == {"thread": 41, "side": 42}
