"""The environment variables minitensor reads: an unusable value names the variable and what was expected, and an
unusable cache folder falls back to a temporary one with a warning, rather than failing `import minitensor`.
Each case runs in a fresh interpreter, since the variables are read once per process."""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import minitensor as mt
from helpers import REPO

SCRIPT = """
    import warnings
    warnings.simplefilter("always")
    import minitensor as mt
    from minitensor.base import diskcache
    x = mt.ones(3, device="cuda") + 1
    print("folder:", diskcache.path("x"))
    print("values:", x.cpu().numpy().tolist())
"""


def run(env, code=SCRIPT):
    full = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full.setdefault("MINITENSOR_BACKEND", mt.cuda.backend())
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=300)


def _read_only_folder(tmp_path):
    """A folder this process cannot write to: a chmod 555 one, or for root (whom permissions do not stop)
    /sys, an existing folder where no one may create files."""
    if os.geteuid() == 0:
        return "/sys"
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return str(folder)


@pytest.mark.parametrize("kind", ["a file", "a read-only folder", "below a file"])
def test_unusable_cache_folder_falls_back_to_a_temporary_one(tmp_path, kind):
    if kind == "a file":
        bad = tmp_path / "file"
        bad.write_text("not a folder")
    elif kind == "below a file":
        (tmp_path / "file").write_text("not a folder")
        bad = tmp_path / "file" / "cache"
    else:
        bad = _read_only_folder(tmp_path)
    p = run({"MINITENSOR_CACHE_DIR": str(bad)})
    assert p.returncode == 0, p.stderr
    assert f"MINITENSOR_CACHE_DIR={str(bad)!r} is not usable" in p.stderr, p.stderr
    assert "RuntimeWarning" in p.stderr and p.stderr.count("is not usable") == 1, p.stderr
    folder = p.stdout.split("folder: ")[1].split("\n")[0]
    assert not folder.startswith(str(bad)) and os.path.basename(os.path.dirname(folder)).startswith("minitensor-")
    assert "values: [2.0, 2.0, 2.0]" in p.stdout
    assert not os.path.exists(os.path.dirname(folder)), "the temporary cache outlived its process"


def test_read_only_cache_with_its_entries_is_used_without_warning(tmp_path):
    """A prepared cache on a read-only medium: the entries it has are read from it (the kernels' entries too,
    files name.cubin and name.json), no warning."""
    cache = tmp_path / "cache"
    assert run({"MINITENSOR_CACHE_DIR": str(cache)}).returncode == 0  # fills it
    (cache / "kernels-test.cubin").write_bytes(b"")
    (cache / "kernels-test.json").write_bytes(b"{}")
    entries = sorted(os.listdir(cache))
    if os.geteuid() != 0:
        cache.chmod(0o555)
    code = """
        import warnings
        warnings.simplefilter("error")
        import minitensor as mt
        from minitensor.base import diskcache
        import os
        names = os.listdir(os.environ["MINITENSOR_CACHE_DIR"]) + ["kernels-test"]
        print(all(os.path.dirname(diskcache.path(name)) == os.environ["MINITENSOR_CACHE_DIR"] for name in names))
    """
    p = run({"MINITENSOR_CACHE_DIR": str(cache)}, code)
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr
    assert sorted(os.listdir(cache)) == entries


def test_unwritable_cache_folder_reads_its_entries_and_writes_elsewhere(tmp_path, monkeypatch):
    """In this process, with the folder found unwritable (as a read-only medium is, even for root): its entries
    are read from it, a missing one goes to the temporary folder, with one warning."""
    from minitensor.base import diskcache
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "have").write_bytes(b"x")
    (folder / "kernels-k.json").write_bytes(b"{}")
    monkeypatch.setenv("MINITENSOR_CACHE_DIR", str(folder))
    monkeypatch.setitem(diskcache._checked, str(folder), "PermissionError: Read-only file system")
    monkeypatch.setattr(diskcache, "_fallback", None)
    assert diskcache.path("have") == str(folder / "have")
    assert diskcache.path("kernels-k") == str(folder / "kernels-k")
    with pytest.warns(RuntimeWarning, match=r"MINITENSOR_CACHE_DIR=.* is not usable \(PermissionError: Read-only"):
        missing = diskcache.path("missing")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert os.path.dirname(diskcache.path("other")) == os.path.dirname(missing) != str(folder)
    diskcache.write(missing, b"y")
    assert open(missing, "rb").read() == b"y"


@pytest.mark.parametrize("name, value, message", [
    ("MINITENSOR_SIM_MEMORY", "abc", "MINITENSOR_SIM_MEMORY must be an integer number of bytes >= 512, got 'abc'"),
    ("MINITENSOR_SIM_MEMORY", "100", "MINITENSOR_SIM_MEMORY must be an integer number of bytes >= 512, got '100'"),
    ("MINITENSOR_SIM_MEMORY", "1e9", "MINITENSOR_SIM_MEMORY must be an integer number of bytes >= 512, got '1e9'"),
    ("MINITENSOR_SIM_DEVICES", "abc", "MINITENSOR_SIM_DEVICES must be an integer >= 1, got 'abc'"),
    ("MINITENSOR_SIM_DEVICES", "0", "MINITENSOR_SIM_DEVICES must be an integer >= 1, got '0'"),
    ("MINITENSOR_ALLOC_CONF", "garbage", "MINITENSOR_ALLOC_CONF: Unrecognized key 'garbage'"),
    ("MINITENSOR_ALLOC_CONF", "max_split_size_mb", "MINITENSOR_ALLOC_CONF: Allocator settings: expected ':' after"),
    ("MINITENSOR_BACKEND", "cpu", "MINITENSOR_BACKEND must be 'nvidia' or 'sim', got 'cpu'"),
])
def test_bad_variable_is_named_in_the_error(name, value, message):
    env = {name: value}
    if name.startswith("MINITENSOR_SIM"):
        env["MINITENSOR_BACKEND"] = "sim"
    p = run(env)
    assert p.returncode != 0 and message in p.stderr, p.stderr[-2000:]
    assert "Traceback" in p.stderr and "ValueError: invalid literal" not in p.stderr


def test_no_caching_flag_other_than_0_or_1_is_ignored_with_a_warning():
    """torch's rule for its boolean flags (PYTORCH_NO_CUDA_MEMORY_CACHING): 0 or 1, anything else warns."""
    code = """
        import warnings
        warnings.simplefilter("always")
        import minitensor as mt
        mt.ones(3, device="cuda")
        print(type(mt.cuda.memory.allocator(0)).__name__)
    """
    p = run({"MINITENSOR_NO_CACHING": "yes"}, code)
    assert p.returncode == 0 and p.stdout.strip() == "DeviceCachingAllocator", p.stderr
    assert "Ignoring invalid value for boolean flag MINITENSOR_NO_CACHING: 'yes'; valid values are 0 or 1" in p.stderr
    p = run({"MINITENSOR_NO_CACHING": "0"}, code)
    assert p.stdout.strip() == "DeviceCachingAllocator" and "Ignoring" not in p.stderr
