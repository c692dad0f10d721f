"""The offline memory viewer (minitensor.memory_viz): its numbers in Python, its CLI, what it refuses, and its page
in a real headless Chromium through Selenium.

Snapshots come from fake_snapshots.FakeAllocator, a tiny caching allocator that writes torch's snapshot format and
keeps the truth at every state, so the viewer is checked against numbers it did not compute.
"""
import base64
import hashlib
import html
import json
import os
import pickle
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import memory_viz_fuzz
from fake_snapshots import make
from minitensor import memory_viz

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def expected(fake):
    """The summary's numbers from the generator's own bookkeeping."""
    allocated = [t[0] for t in fake.truth]
    reserved = [t[1] for t in fake.truth]
    peak = allocated.index(max(allocated))
    return {"entries": len(fake.trace), "allocations": len(fake.shapes), "segments": len(fake.segments),
            "peak_allocated": allocated[peak], "peak_allocated_at": peak, "reserved_at_peak": reserved[peak],
            "fragmentation": reserved[peak] - allocated[peak], "peak_reserved": max(reserved),
            "end_allocated": allocated[-1], "end_reserved": reserved[-1]}


@pytest.fixture(scope="module")
def small():
    fake = make(400, seed=1, streams=(0, 7), pools=((0, 0), (1, 2)))
    assert any(e["action"] == "free_completed" and e["addr"] not in {x["addr"] for x in fake.trace[:i]
               if x["action"] == "alloc"} for i, e in enumerate(fake.trace)), "no allocation predates the trace"
    return fake


# ------------------------------------------------------------------------------------ Python side
def test_summary_matches_the_allocators_truth(small):
    got = memory_viz.summarize(small.snapshot())["cuda:0"]
    want = expected(small)
    assert {k: got[k] for k in want} == want
    sizes = sorted((s for s, _, _ in small.shapes), reverse=True)[:memory_viz.TOP]
    assert [a["size"] for a in got["largest"]] == sizes
    assert got["peak_reserved"] >= got["peak_allocated"] > 0 and got["fragmentation"] >= 0


def test_summary_of_segments_only_and_of_empty():
    fake = make(0, seed=2)
    segs = fake.snapshot()["segments"]
    got = memory_viz.summarize(segs)["cuda:0"]
    blocks = [b for s in segs for b in s["blocks"] if b["state"] != "inactive"]
    assert got["entries"] == 0 and got["allocations"] == len(blocks) and got["segments"] == len(segs)
    assert got["peak_allocated"] == got["end_allocated"] == sum(b["size"] for b in blocks)
    assert got["peak_reserved"] == sum(s["total_size"] for s in segs)
    assert memory_viz.summarize({"segments": [], "device_traces": []})["cuda:0"]["peak_allocated"] == 0


def test_a_snapshot_block_counts_its_requested_size():
    """A block the trace never saw allocated is shown with the bytes asked for, as the trace's entries carry
    them; its rounded size still places the next block."""
    blocks = [{"address": 0x1000, "size": 4096, "requested_size": 4000, "state": "active_allocated"},
              {"size": 512, "requested_size": 40, "state": "active_allocated"}]
    segs = [{"device": 0, "address": 0x1000, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
             "segment_pool_id": (0, 0), "allocated_size": 4608, "active_size": 4608, "requested_size": 4040,
             "blocks": blocks}]
    got = memory_viz.summarize({"segments": segs, "device_traces": [[]]})["cuda:0"]
    assert got["peak_allocated"] == got["end_allocated"] == 4040


def test_trace_edge_cases():
    """A free the trace lost (an alloc at a live address ends the old one), torch's merged "free", a free of an
    allocation older than the trace, an out-of-memory entry, and an entry of an action nobody knows."""
    e = lambda action, addr, size: {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0,
                                    "frames": []}
    trace = [e("segment_alloc", 0, 4096), e("alloc", 0, 1024), e("alloc", 0, 2048), e("oom", 0, 1 << 40),
             e("free", 0, 2048), e("free_completed", 3072, 512), e("mystery", 0, 0), e("alloc", 1024, 256)]
    segment = {"device": 0, "address": 0, "total_size": 4096, "stream": 0, "segment_pool_id": (0, 0), "blocks": [
        {"address": 0, "size": 1024, "state": "inactive"},
        {"address": 1024, "size": 256, "state": "active_allocated"},
        {"address": 1280, "size": 2816, "state": "inactive"}]}
    got = memory_viz.summarize({"segments": [segment], "device_traces": [trace]})["cuda:0"]
    assert (got["entries"], got["allocations"], got["segments"]) == (8, 4, 1)
    assert (got["peak_allocated"], got["peak_allocated_at"], got["end_allocated"]) == (2560, 3, 256)
    assert got["peak_reserved"] == got["end_reserved"] == 4096 and got["reserved_at_peak"] == 4096
    assert [(a["size"], a["start"], a["end"]) for a in got["largest"]] == [
        (2048, 3, 5), (1024, 2, 3), (512, 0, 6), (256, 8, None)]


def test_cli_writes_the_page(small, tmp_path):
    src = tmp_path / "snap.pickle"
    src.write_bytes(pickle.dumps(small.snapshot(), protocol=4))
    out = tmp_path / "out.html"
    run = subprocess.run([sys.executable, "-m", "minitensor.memory_viz", str(src), "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    page = out.read_text()
    assert page.count("<script") == 2 and '<script type="application/json" id="mtviz-data">' in page
    assert not any(s in page for s in ("http://", "https://", " src=", "<link", "@import", "url("))
    assert f'data-key="peak_allocated" data-value="{expected(small)["peak_allocated"]}"' in page
    run = subprocess.run([sys.executable, "-m", "minitensor.memory_viz", str(src)], capture_output=True, text=True,
                         timeout=120)  # without -o: beside the snapshot, named after it
    assert run.returncode == 0 and (tmp_path / "snap.html").read_text() == page, run.stderr


@pytest.mark.parametrize("content, says", [
    (None, "no such file"),
    (b"\x00garbage, not a pickle\xff", "not a memory snapshot pickle"),
    (pickle.dumps({"weights": [1, 2]}), "not a memory snapshot"),
    (pickle.dumps(random.Random(0)), "a snapshot holds plain Python values only"),
    (pickle.dumps({"segments": [{"blocks": []}], "device_traces": []}), "segments[0]['address']: missing"),
], ids=["missing", "garbage", "other-pickle", "a-class", "malformed"])
def test_cli_refuses_what_is_not_a_snapshot(tmp_path, content, says):
    src = tmp_path / "input.pickle"
    if content is not None:
        src.write_bytes(content)
    run = subprocess.run([sys.executable, "-m", "minitensor.memory_viz", str(src), "-o", str(tmp_path / "o.html")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and str(src) in run.stderr and says in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "o.html").exists()


PWN = "</td></tr></table><script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"


def crafted(where):
    """A small snapshot with the markup PWN in one string field the page shows (`where`), or in all of them."""
    snap = make(30, seed=3).snapshot()
    alloc = next(e for e in snap["device_traces"][0] if e["action"] == "alloc")
    if where in ("frame", "all"):
        alloc["frames"] = [{"filename": PWN, "line": 1, "name": PWN}]
        alloc["size"] = 1 << 40  # the largest: its frame is in the summary's table
    if where in ("segment type", "all"):
        snap["segments"][0]["segment_type"] = PWN
    if where == "stream":  # the field seen unescaped: a number, shown in the table of a block the trace never saw
        size = 1 << 40
        snap["segments"].append({"device": 0, "address": 1 << 44, "total_size": size, "stream": PWN, "blocks": [
            {"address": 1 << 44, "size": size, "state": "active_allocated", "frames": []}]})
    return snap


def script_parts(page):
    """(the Content-Security-Policy's script-src sources, the text of the page's one executable script)."""
    policy = re.search(r'http-equiv="Content-Security-Policy"\s+content="([^"]*)"', page).group(1)
    sources = next(d.split()[1:] for d in policy.split(";") if d.split()[:1] == ["script-src"])
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 1 and page.count("<script") == 2
    return sources, scripts[0]


def test_page_escapes_what_the_snapshot_says(tmp_path):
    name = tmp_path / '<img src=x onerror="window.__pwned=3">&@DATA@.pickle'
    name.write_bytes(pickle.dumps(crafted("all"), protocol=4))
    page = memory_viz.render(name)
    assert "<img" not in page and "<b>" not in page and page.count("<script") == 2
    assert page.lower().count("</script") == 2 and "@DATA@" in page  # the title: shown, not substituted
    assert html.escape(PWN) in page  # the frame in the largest-allocations table, as text
    data = page[page.index('id="mtviz-data">') + 16:page.index("</script>")]
    assert not set("<>&") & set(data) and any(PWN in frame for frame in json.loads(data)["frames"])


def test_csp_runs_only_the_pages_own_script(small):
    sources, script = script_parts(memory_viz.render(small.snapshot()))
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert sources == [f"'sha256-{digest}'"], sources  # no 'unsafe-inline', nothing else


def test_page_script_writes_text_only():
    """memory_viz.js puts the snapshot's strings in the page as text (textContent, canvas), never as markup."""
    source = (Path(memory_viz.__file__).parent / "memory_viz.js").read_text()
    sinks = re.findall(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|Function\(|srcdoc|"
                       r"setAttribute\(\s*['\"]on|\.on\w+\s*=", source)
    assert sinks == [] and "textContent" in source


def _nested(depth):
    out = "deep"
    for _ in range(depth):
        out = [out]
    return out


def _set(path, value):
    def change(snap):
        *steps, last = path
        target = snap
        for step in steps:
            target = target[step] if not callable(step) else step(target)
        target[last] = value
    return change


_ALLOC = lambda trace: next(e for e in trace if e["action"] == "alloc")  # noqa: E731
MALFORMED = [  # (what changes, what the error names)
    (_set(["segments", 0, "stream"], PWN), "segments[0]['stream']: an int in [-2**63, 2**64 - 1] expected, got"),
    (_set(["device_traces", 0, _ALLOC, "addr"], "0x7f0000000000"), "['addr']: an int in [0, 2**64 - 1] expected"),
    (_set(["segments", 0, "blocks", 0, "address"], "0x7f0000000000"), "segments[0]['blocks'][0]['address']"),
    (_set(["segments", 0, "address"], 2**70), "segments[0]['address']: an int in [0, 2**64 - 1] expected, got an int "
                                              "of 71 bits"),
    (_set(["segments", 0, "total_size"], True), "segments[0]['total_size']: an int"),
    (_set(["device_traces", 0, _ALLOC, "size"], 1.5), "['size']: an int"),
    (_set(["device_traces", 0, 0, "time_us"], float("nan")), "device_traces[0][0]['time_us']: a number of "
                                                             "microseconds within int64 expected, got nan"),
    (_set(["device_traces", 0, _ALLOC, "frames"], [{"filename": _nested(5000), "line": 1, "name": "f"}]),
     "['frames'][0]['filename']: a string expected, got a list"),
    (_set(["device_traces", 0, _ALLOC, "frames"], "f.py:1"), "['frames']: a list expected, got 'f.py:1'"),
    (_set(["device_traces", 0, _ALLOC, "frames"], [["f.py", 1]]), "['frames'][0]: a frame must be a dict"),
    (_set(["device_traces", 0, _ALLOC, "pool_id"], (_nested(5000), 0)), "['pool_id']: a pool id (a pair of ints)"),
    (_set(["device_traces", 0, _ALLOC, "pool_id"], "ab"), "['pool_id']: a pool id (a pair of ints) expected, got 'ab'"),
    (_set(["segments", 0, "segment_type"], ["small"]), "segments[0]['segment_type']: a string expected"),
    (_set(["segments", 0, "device"], "cuda:1"), "segments[0]['device']: an int in [0, 2**63 - 1] expected"),
    (_set(["device_traces", 0, 1], "alloc"), "device_traces[0][1]: a trace entry must be a dict, got 'alloc'"),
    (_set(["device_traces", 0, 1, "action"], 3), "device_traces[0][1]['action']: a string expected, got 3"),
    (_set(["segments", 0, "blocks"], {"size": 1}), "segments[0]['blocks']: a list expected, got a dict"),
    (_set(["host_traces"], [[], "x"]), "host_traces: a list of lists of entries expected"),
    (_set(["host_segments"], 7), "the snapshot['host_segments']: a list expected, got 7"),
]


@pytest.mark.parametrize("change, says", MALFORMED, ids=[says.split(":")[0] for _, says in MALFORMED])
def test_a_malformed_snapshot_is_one_line_naming_the_field(tmp_path, change, says):
    """Whatever a field holds that torch does not write there: SnapshotError, one line, naming the field, given as a
    dict or read from a pickle; never another exception, a page with it, or a crash."""
    snap = make(30, seed=3).snapshot()
    change(snap)
    with pytest.raises(memory_viz.SnapshotError) as caught:
        memory_viz.render(snap)
    assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    try:
        data = pickle.dumps(snap, protocol=4)
    except RecursionError:  # Python's pickler cannot write it, the reader refuses it as too deep
        return
    (tmp_path / "s.pickle").write_bytes(data)
    with pytest.raises(memory_viz.SnapshotError) as caught:
        memory_viz.render(tmp_path / "s.pickle")
    assert str(caught.value).startswith(str(tmp_path / "s.pickle")) and says in str(caught.value)


HOSTILE = [  # (pickle builder, its size, what the one line on stderr says; None: the page is written, and small)
    (memory_viz_fuzz.deep_pool_id, 200_000, "a tuple nested more than 1000 containers deep"),
    (memory_viz_fuzz.deep_frames, 5000, "a list nested more than 1000 containers deep"),
    (memory_viz_fuzz.shared_segments, 50_000, "a segment of 50000 blocks went past it"),
    (memory_viz_fuzz.shared_host_traces, 50_000, "joining 50000 host traces went past it"),
    (memory_viz_fuzz.long_file_name, 2000, "the text of a frame went past it"),
    (memory_viz_fuzz.big_time, 1000, "device_traces[0][0]['time_us']: a number of microseconds"),
    (memory_viz_fuzz.a_global, 1, "it names os.system, and a snapshot holds plain Python values only"),
    (memory_viz_fuzz.one_hash, 100, "more than 16 keys with one hash"),
    (memory_viz_fuzz.shared_entries, 50_000, None),  # each stack is walked once, however often it is used
    (memory_viz_fuzz.shared_segment_type, 20_000, None),  # and each string stored once
]


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("build, n, says", HOSTILE, ids=[b.__name__ for b, _, _ in HOSTILE])
def test_hostile_pickles_are_bounded_by_their_size(tmp_path, build, n, says):
    """Pickles of a few hundred KB that crashed the viewer (a nested pool id), or asked it for hundreds of GB (one
    segment, list of frames or string repeated through the memo): refused in one line, or rendered small, within
    1 GiB of address space."""
    src, out = tmp_path / "hostile.pickle", tmp_path / "hostile.html"
    src.write_bytes(build(n))
    assert src.stat().st_size < 3 << 20
    run = subprocess.run([sys.executable, "-m", "minitensor.memory_viz", str(src), "-o", str(out)],
                         capture_output=True, text=True, timeout=120, preexec_fn=_capped)
    if says is None:
        assert run.returncode == 0 and out.stat().st_size < 16 << 20, run.stderr
    else:
        assert run.returncode == 1 and says in run.stderr and run.stderr.count("\n") == 1, run.stderr
        assert run.stderr.startswith(f"memory_viz: error: {src}: ") and not out.exists()


def test_import_needs_no_runtime():
    """minitensor.memory_viz adds to `import minitensor` only its own modules, minitensor.base's and the standard
    library's, and rendering imports nothing more: no Triton, no cuda-bindings, no backend started."""
    code = textwrap.dedent("""
        import json, sys
        import minitensor
        before = set(sys.modules)
        import minitensor.memory_viz
        minitensor.memory_viz.render({"segments": [], "device_traces": []})
        print(json.dumps(sorted(set(sys.modules) - before)))
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "cuda", "torch")
                                or m.startswith(("minitensor.kernels", "minitensor.serialization",
                                                 "minitensor.backends.sim", "minitensor.backends.nvidia")))))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    added, runtime = (json.loads(line) for line in run.stdout.splitlines())
    assert runtime == [], runtime
    foreign = [m for m in added if not m.startswith(("minitensor.memory_viz", "minitensor.base."))
               and m.split(".")[0] not in sys.stdlib_module_names]
    assert foreign == [] and "minitensor.base.pickle_reader" in added, added


# ------------------------------------------------------------------------------------ the browser
@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip(f"no {CHROMIUM} or {CHROMEDRIVER} (Debian: apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="mtviz-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, path, timeout=10):
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(Path(path).resolve().as_uri())
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script("return !!(window.__mtviz && __mtviz.ready)"))


def severe(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def move_mouse(driver, x, y):
    from selenium.webdriver.common.action_chains import ActionChains
    chain = ActionChains(driver)
    chain.w3c_actions.pointer_action.move_to_location(int(round(x)), int(round(y)))
    chain.perform()


def tooltip_after(driver, x, y, timeout=5):
    from selenium.webdriver.support.ui import WebDriverWait
    move_mouse(driver, x, y)
    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
        "const t = document.getElementById('tooltip'); return t.hidden ? false : t.textContent"))


def test_page_in_chromium(browser, small, tmp_path):
    page = memory_viz.write_html(small.snapshot(), tmp_path / "memory.html")
    open_page(browser, page)
    js = browser.execute_script
    assert severe(browser) == []
    assert js("return [__mtviz.shapes, __mtviz.allocations, __mtviz.entries]") == \
        [len(small.shapes), len(small.shapes), len(small.trace)]

    # hover the largest recorded allocations with the mouse: the tooltip names size, address and frame
    recorded = sorted((s for s in small.shapes if s[2] is not None), key=lambda s: -s[0])[:3]
    for size, frames, entry in recorded:
        alloc = small.trace[entry]
        ident = js("return __mtviz.allocationStartedAt(arguments[0])", entry + 1)
        spot = js("return __mtviz.locate(arguments[0])", ident)
        assert spot is not None, f"allocation of {size} bytes at entry {entry} is not visible"
        text = tooltip_after(browser, spot["clientX"], spot["clientY"])
        top = f"{frames[0]['filename']}:{frames[0]['line']}"
        assert f"({size} bytes)" in text and top in text and f"0x{alloc['addr']:x}" in text, text
        assert js("return __mtviz.hover(arguments[0], arguments[1])", spot["x"], spot["y"]) == text
    assert "allocation #" not in (js("return __mtviz.hover(5, 5)") or "")  # the margin: nothing

    # the segment map: every live segment at the end and at earlier states, with its blocks
    assert js("return __mtviz.segmentsDrawn") == len(small.segments) == js("return __mtviz.segmentsAtEnd")
    rects = js("return __mtviz.segmentRects()")
    assert sorted(r["addr"] for r in rects) == sorted(s["address"] for s in small.segments)
    assert all(r["w"] >= 3 and r["h"] > 0 for r in rects)
    assert {tuple(r["pool"]) for r in rects} == {s["pool"] for s in small.segments}
    for t in (0, 1, len(small.trace) // 3, len(small.trace) // 2, len(small.trace)):
        js("__mtviz.setTime(arguments[0])", t)
        _, _, segs, blocks = small.truth[t]
        assert js("return [__mtviz.segmentsDrawn, __mtviz.blocksDrawn]") == [segs, blocks], f"state {t}"
    r = js("return __mtviz.segmentRects()")[0]
    assert js("return __mtviz.hoverSegments(arguments[0], arguments[1])", r["x"] + 1, r["y"] + 1).startswith(
        f"segment 0x{r['addr']:x}")

    # the summary table says what the allocator's truth says
    cells = browser.find_elements("css selector", '.summary[data-device="cuda:0"] table.numbers td[data-key]')
    got = {c.get_attribute("data-key"): int(c.get_attribute("data-value")) for c in cells}
    want = expected(small)
    assert {k: got[k] for k in want if k in got} == {k: want[k] for k in want if k in got} and len(got) == 9
    sizes = [int(c.get_attribute("data-value")) for c in browser.find_elements(
        "css selector", '.summary[data-device="cuda:0"] table.largest td[data-key="size"]')]
    assert sizes == sorted((s for s, _, _ in small.shapes), reverse=True)[:memory_viz.TOP]

    # zoom: the wheel narrows the view around the pointer, reset restores it
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin
    canvas = browser.find_element("id", "timeline")
    ActionChains(browser).scroll_from_origin(ScrollOrigin.from_element(canvas), 0, -400).perform()
    a, b = js("return __mtviz.view()")
    assert b - a < len(small.trace) + 1
    js("__mtviz.reset()")
    assert js("return __mtviz.view()") == [0, len(small.trace) + 1]
    shot = tmp_path / "memory_viz_small.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0
    print(f"screenshot: {shot}")
    assert severe(browser) == []


def test_two_devices_and_pinned_host(browser, tmp_path):
    one, two = make(80, seed=4), make(120, seed=5, device=1)
    snap = one.snapshot()
    snap["segments"] += two.snapshot()["segments"]
    snap["device_traces"].append(two.trace)
    host = make(0, seed=6)
    snap["host_segments"] = host.snapshot()["segments"]
    open_page(browser, memory_viz.write_html(snap, tmp_path / "two.html"))
    js = browser.execute_script
    assert js("return __mtviz.devices") == ["cuda:0", "cuda:1", "host (pinned)"]
    js("__mtviz.setDevice('cuda:1')")
    assert js("return [__mtviz.shapes, __mtviz.segmentsDrawn]") == [len(two.shapes), len(two.segments)]
    js("__mtviz.setDevice('host (pinned)')")  # segments only: one state, no trace
    assert js("return [__mtviz.entries, __mtviz.shapes, __mtviz.segmentsDrawn]") == \
        [0, len(host.shapes), len(host.segments)]
    spot = js("for (let i = 0; i < __mtviz.shapes; i++) { const p = __mtviz.locate(i); if (p) return p; }")
    assert "allocated before the trace began" in js("return __mtviz.hover(arguments[0], arguments[1])",
                                                    spot["x"], spot["y"])
    open_page(browser, memory_viz.write_html({"segments": [], "device_traces": []}, tmp_path / "empty.html"))
    assert js("return [__mtviz.shapes, __mtviz.segmentsDrawn, __mtviz.hover(300, 200)]") == [0, 0, None]
    assert severe(browser) == []


def test_hundred_thousand_entries_open_within_3_s(browser, tmp_path):
    fake = make(100_000, seed=7, streams=(0, 3), pools=((0, 0), (2, 1)))
    start = time.perf_counter()
    page = memory_viz.write_html(fake.snapshot(), tmp_path / "big.html")
    export = time.perf_counter() - start
    wall = time.perf_counter()
    open_page(browser, page, timeout=30)
    ready_wall = time.perf_counter() - wall
    js = browser.execute_script
    ready_ms = js("return __mtviz.readyMs")
    size, frames, entry = max((s for s in fake.shapes if s[2] is not None), key=lambda s: s[0])
    spot = js("return __mtviz.locate(__mtviz.allocationStartedAt(arguments[0]))", entry + 1)
    assert spot is not None
    hover_ms = js("const t = performance.now(); __mtviz.hover(arguments[0], arguments[1]);"
                  "return performance.now() - t", spot["x"], spot["y"])
    mouse = time.perf_counter()
    text = tooltip_after(browser, spot["clientX"], spot["clientY"])
    mouse_ms = (time.perf_counter() - mouse) * 1000
    stats = js("return __mtviz.drawStats()")
    print(f"\n100k: {len(fake.trace)} entries, {len(fake.shapes)} allocations, page "
          f"{Path(page).stat().st_size / 1e6:.1f} MB written in {export:.2f} s; ready {ready_ms:.0f} ms after "
          f"navigation (wall {ready_wall * 1000:.0f} ms from driver.get), hover {hover_ms:.1f} ms in page, "
          f"{mouse_ms:.0f} ms mouse-to-tooltip through WebDriver; draw {stats}")
    assert f"({size} bytes)" in text and f"{frames[0]['filename']}:{frames[0]['line']}" in text
    assert js("return __mtviz.shapes") == len(fake.shapes)
    assert ready_ms + hover_ms < 3000, f"ready {ready_ms:.0f} ms + hover {hover_ms:.0f} ms"
    assert severe(browser) == []


def test_crafted_snapshots_run_no_script_in_chromium(browser, tmp_path):
    """Markup in each string field the page shows, and in a number field (a segment's stream, seen written as it
    came): refused, or shown as text; the page's own script runs, and nothing of the snapshot's."""
    js = browser.execute_script
    rendered = []
    for where in ("stream", "frame", "segment type", "all"):
        snap = crafted(where)
        try:
            page = memory_viz.write_html(snap, tmp_path / f"{where.replace(' ', '_')}.html")
        except memory_viz.SnapshotError as e:
            assert "['stream']" in str(e)
            continue
        open_page(browser, page)
        assert js("return window.__pwned === undefined"), f"markup in the {where} ran"
        assert severe(browser) == [], where
        rendered.append(where)
    assert rendered == ["frame", "segment type", "all"]
    assert PWN in js("return document.querySelector('.summary table.largest td.frame').textContent")
    segment = snap["segments"][0]
    rect = next(r for r in js("return __mtviz.segmentRects()") if r["addr"] == segment["address"])
    assert f"{PWN}\n" in js("return __mtviz.hoverSegments(arguments[0], arguments[1])", rect["x"] + 1, rect["y"] + 1)


def test_csp_blocks_markup_that_got_in(browser, small, tmp_path):
    """Were a field ever written unescaped, its script would not run: the policy admits the page's script by its
    hash and nothing inline besides."""
    injected = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    page = memory_viz.render(small.snapshot()).replace("<body>", "<body>" + injected, 1)
    (tmp_path / "injected.html").write_text(page)
    open_page(browser, tmp_path / "injected.html")
    assert browser.execute_script("return window.__pwned === undefined && __mtviz.entries") == len(small.trace)
    assert any("Content Security Policy" in e["message"] for e in severe(browser))


# ------------------------------------------------------------------------------------ minitensor's own recorder
RECORD = textwrap.dedent("""
    import sys
    import minitensor as mt
    mt.cuda.memory._record_memory_history(max_entries=10000)
    keep = [mt.ones(256 * (i + 1), device="cuda") for i in range(8)]
    del keep[::2]
    scratch = mt.zeros(4096, device="cuda") + 1
    mt.cuda.memory._dump_snapshot(sys.argv[1])
""")


def test_renders_what_minitensor_records(browser, tmp_path):
    import minitensor.cuda.memory as memory
    if not hasattr(memory, "_snapshot") or not hasattr(memory, "_dump_snapshot"):
        pytest.skip("minitensor.cuda.memory has no _snapshot/_dump_snapshot yet (the recorder is being written)")
    snap = tmp_path / "mt.pickle"
    env = dict(os.environ, MINITENSOR_BACKEND="sim")
    run = subprocess.run([sys.executable, "-c", RECORD, str(snap)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    summary = memory_viz.summarize(snap)["cuda:0"]
    assert summary["entries"] > 0 and summary["allocations"] >= 9 and summary["peak_allocated"] > 0
    open_page(browser, memory_viz.write_html(snap, tmp_path / "mt.html"))
    assert browser.execute_script("return [__mtviz.shapes, __mtviz.segmentsDrawn]") == \
        [summary["allocations"], summary["segments"]]
    assert severe(browser) == []
