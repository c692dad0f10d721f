"""CUDA C++ kernels on the simulated device: the source compiled by the host C++ compiler against a prelude
(cuda_emulation.h) that runs a grid's blocks one after another and each block's threads one after another.

Device memory is host memory on the simulator, so a device pointer is a host address and a kernel's loads and
stores need no translation. Sequential threads give exactly the GPU's results for kernels whose threads never
wait for each other; a source using what needs threads running together (shared memory, barriers, warp-level
operations, cooperative groups, inline PTX, textures, launches from device code) is refused before compiling, with
NotImplementedError. Global-memory atomics are fine.

- `emulated_module(source, options)`: kernels called from Python. Each `__global__` kernel with a launchable
  signature (cuda_signatures) gets an entry point `__mt_launch_<name>(dims, args)`; `module.launcher(name)` gives
  `prepare(gx, gy, gz, bx, by, bz, *args)`, which checks the launch and packs the arguments now and returns `run()`,
  which runs the whole grid on the calling thread with the GIL released (the caller queues it on a simulated
  stream).
- `emulated_library(source, options)`: a shared library of host functions whose `kernel<<<grid, block>>>(...)`
  launches (rewritten to the prelude's `__mt_emu::launch`) run the kernel at once, on the calling thread.

Options: `-D NAME[=VALUE]`, `-U NAME` and `-I FOLDER` (also as `--define-macro=`, `--undefine-macro=`,
`--include-path=`, attached or as the next item) go to the compiler. GPU code-generation options (`-arch`,
`-gencode`, `-code`, `--std`, `-O`, `--use_fast_math`, `-lineinfo`, `-G`, `-rdc`, `-ftz`, `-prec-div`, `-fmad`,
`-maxrregcount`, `-Xptxas`, ...) are accepted and ignored: the emulation always compiles C++17 at -O2, without
strict aliasing (CUDA sources reinterpret memory freely). Any other option is refused with ValueError.

Builds are cached on disk (minitensor.base.diskcache), keyed by the translated source, the prelude, the
compiler's identity, the flags and the files of the -I folders, and in this process by the same key. A cached
library is sealed and checked before it is loaded: a truncated, empty or swapped one is compiled again.
"""
import bisect
import contextlib
import ctypes
import functools
import hashlib
import math
import operator
import os
import re
import shlex
import shutil
import struct
import subprocess
import threading

from minitensor.base import diskcache
from minitensor.base.errors import CompileError

from . import cuda_signatures

_PRELUDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_emulation.h")
# no strict aliasing: CUDA sources often reinterpret memory (a float's bits as int for atomicCAS, float4 loads)
_FLAGS = ("-std=c++17", "-O2", "-shared", "-fPIC", "-fno-strict-aliasing")
_HEADERS = ("cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "device_launch_parameters.h", "device_functions.h",
            "vector_types.h")
_lock = threading.Lock()
_built = {}  # build key -> path of the shared library
_modules = {}  # path of the shared library -> EmulatedModule

_WHY = ("the simulated device runs CUDA kernels one thread after another on the CPU, so only kernels without "
        "shared memory, barriers or warp-level operations run there; run it on a GPU")
_REFUSED = [(re.compile(pattern), what) for pattern, what in (
    (r"\b__shared__\b", "shared memory"),
    (r"\b__syncthreads\w*", "a block barrier"),
    (r"\b__syncwarp\b", "a warp barrier"),
    (r"\b(?:__shfl\w*|__ballot\w*|__any_sync|__all_sync|__uni_sync|__activemask|__match_\w+_sync"
     r"|__reduce_\w+_sync|__any|__all)\b", "a warp-level operation"),
    (r"\b(?:cooperative_groups|this_thread_block|this_grid|tiled_partition)\b", "cooperative groups"),
    (r"\b(?:asm|__asm__|__asm)\b(?:\s+(?:volatile|__volatile__))?\s*\(", "inline assembly"),
    (r"\b(?:texture|surface)\s*<|\bcuda(?:Texture|Surface)Object_t\b|\b(?:tex|surf)(?:1D|2D|3D|Cubemap)\w*",
     "a texture or surface"),
)]
# a launch's brackets: `operator<<` is one token, so `operator<<<T>` (a template operator) opens no launch
_LAUNCH_TOKENS = re.compile(r"\boperator\s*<<|<<<|>>>|[()\[\]{}]")
# the kernel before `<<<` ("k", "ns::k", "::k", "k<float, 4>"), matched in the reversed text from the `<<<`
_CALLEE_BACKWARDS = re.compile(r"\s*(?:>(?:[^<>;{}]*>[^<>;{}]*<)*[^<>;{}]*<\s*)?"
                               r"(?:\w*[A-Za-z_]\s*::\s*)*\w*[A-Za-z_](?:\s*::)?(?![\w:])")
_CALL = re.compile(r"\s*\(")
_NOINLINE = re.compile(r"(?P<gcc>__attribute__\s*\(\([^()]*?)?\b(?P<token>__noinline__)\b")

_PASSED = {"-D": "-D", "--define-macro": "-D", "-U": "-U", "--undefine-macro": "-U", "-I": "-I",
           "--include-path": "-I"}
_PASSED_FORM = re.compile(r"(--define-macro|--undefine-macro|--include-path|-D|-U|-I)=?(\S.*)")
_IGNORED = re.compile(
    r"--?(?:arch|gpu-architecture|gpu-name|gencode|generate-code|code|std|use_fast_math|use-fast-math|lineinfo"
    r"|generate-line-info|G|device-debug|rdc|relocatable-device-code|dc|ftz|prec-div|prec-sqrt|fmad|restrict"
    r"|extra-device-vectorization|expt-relaxed-constexpr|expt-extended-lambda|extended-lambda|default-device"
    r"|device-as-default-execution-space|dopt|maxrregcount|Xptxas|ptxas-options|diag-suppress|dlink-time-opt|dlto"
    r"|split-compile|w|O[0-3]?)(=.*)?")
_VALUED = {"-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "-std", "--std", "-maxrregcount",
           "--maxrregcount", "-Xptxas", "--ptxas-options", "-diag-suppress", "--diag-suppress"}

_FORMATS = {"p": "Q", "i": "i4x", "u": "I4x", "l": "q", "q": "Q", "f": "f4x", "d": "d"}  # 8 bytes per argument
_RANGES = {"p": (0, 2**64), "i": (-2**31, 2**31), "u": (0, 2**32), "l": (-2**63, 2**63), "q": (0, 2**64)}
_EXPECTED = {"p": "an int address", "i": "an int", "u": "an int", "l": "an int", "q": "an int", "f": "a float",
             "d": "a float"}
_LAUNCHABLE = "pointers, int, unsigned int, long long, unsigned long long (size_t), float and double"
_FLOAT_MAX = struct.unpack("=f", b"\xff\xff\x7f\x7f")[0]
_BLOCK_LIMITS, _GRID_LIMITS, _MAX_THREADS = (1024, 1024, 64), (2**31 - 1, 65535, 65535), 1024


class EmulatedModule:
    """The kernels of one CUDA source, compiled for the CPU; `signatures` as cuda_signatures.parse gives them."""

    def __init__(self, path, signatures):
        self.path = path
        self.signatures = signatures
        self._library = ctypes.CDLL(path)
        self._launchers = {}

    def launcher(self, name):
        """`prepare(gx, gy, gz, bx, by, bz, *args)` for kernel `name`, args in its parameter order, pointers as
        ints: it checks the launch and packs the arguments, and returns `run()`, which runs the grid on the calling
        thread (None for an empty grid). The caller queues `run` on a simulated stream."""
        launch = self._launchers.get(name)
        if launch is None:
            signature = self.signatures.get(name)
            if signature is None:
                raise AttributeError(f"the CUDA source defines no __global__ kernel named {name!r}; it defines: "
                                     f"{', '.join(sorted(self.signatures)) or 'none'}")
            _check_launchable(name, signature)
            entry = getattr(self._library, _entry_name(name))
            entry.argtypes, entry.restype = (ctypes.c_void_p, ctypes.c_void_p), None
            launch = self._launchers[name] = _launcher(name, signature, entry)
        return launch


def emulated_module(source, options=()):
    """The EmulatedModule of `source`, built or taken from the caches."""
    flags = _flags(options)
    translated, signatures = _prepared(source)
    path = _build(translated + _entry_points(signatures), flags)
    with _lock:
        if path not in _modules:
            _modules[path] = EmulatedModule(path, signatures)
        return _modules[path]


def emulated_library(source, options=()):
    """The path of a shared library built from a host and device `source`, for ctypes.CDLL: its host functions'
    `<<<...>>>` launches run the kernel on the calling thread before returning."""
    return _build(_prepared(source)[0], _flags(options))


@functools.lru_cache(maxsize=64)
def _prepared(source):
    """(translated source, kernel signatures): a source built again, with other options or by another caller,
    is read once."""
    return translate(source), cuda_signatures.parse(source)


def translate(source):
    """`source` as host C++ for the prelude: launches rewritten, `__noinline__` spelled for GCC; the line numbers
    stay those of `source`. Raises NotImplementedError for what sequential threads cannot run, and CompileError
    naming the line of a launch's `<<<` that no `>>>` closes. Linear in the source's length: one pass pairs
    every `<<<` with its `>>>`."""
    text = cuda_signatures.clean(source)
    functions = cuda_signatures.definitions(text)
    launches, unclosed = _launches(text)
    _refuse(text, functions, sorted([start for start, _ in launches] + unclosed))
    if unclosed:
        raise _unclosed(text, unclosed[0])
    edits = [(m.start("token"), m.end(), "__attribute__((noinline))")
             for m in _NOINLINE.finditer(text) if not m["gcc"]]  # GCC's own __attribute__((__noinline__)) stays
    backwards = text[::-1]  # the callee before each `<<<` is matched backwards from it, in its own length
    for start, end in launches:
        edits += _launch_edits(text, backwards, start, end)
    pieces, done = [], 0
    for start, end, replacement in sorted(edits):
        pieces += [source[done:start], replacement]
        done = end
    return "".join(pieces) + source[done:]


def _launches(text):
    """([(offset of `<<<`, offset of its `>>>`)], [offsets of the `<<<` none closes]), in one pass over the
    brackets: a launch configuration ends at the first `>>>` at the bracket depth of its `<<<` (a `>>>` deeper
    in closes templates), and a bracket opened before the `<<<` closing first leaves it unclosed."""
    launches, unclosed, open_launches, depth = [], [], [], 0
    for m in _LAUNCH_TOKENS.finditer(text):
        token = m.group(0)
        if token == "<<<":
            open_launches.append((m.start(), depth))
        elif token == ">>>":
            if open_launches and open_launches[-1][1] == depth:
                launches.append((open_launches.pop()[0], m.start()))
        elif token in "([{":
            depth += 1
        elif token in ")]}":
            depth -= 1
            while open_launches and open_launches[-1][1] > depth:
                unclosed.append(open_launches.pop()[0])
    unclosed += [start for start, _ in open_launches]
    return launches, sorted(unclosed)


def _unclosed(text, offset):
    """The CompileError for a `<<<` at `offset` that no `>>>` closes, naming its line as a compiler would."""
    line = text.count("\n", 0, offset) + 1
    column = offset - text.rfind("\n", 0, offset)
    log = (f"<source>:{line}:{column}: error: this kernel launch's '<<<' is not closed by '>>>' (a launch is "
           f"kernel<<<grid, block>>>(arguments))\n")
    return CompileError(log, ["minitensor's launch translation for the simulated device"])


def _refuse(text, functions, launches):
    """Raise NotImplementedError at the first construct sequential threads cannot run; `launches` are the offsets
    of the `<<<`s."""
    hits = [(m.start(), what, m.group(0)) for pattern, what in _REFUSED for m in pattern.finditer(text)]
    outermost = []  # the definitions not inside another one (a __device__ lambda is), in source order
    for f in functions:
        if not outermost or f.start >= outermost[-1].body[1]:
            outermost.append(f)
    starts = [f.start for f in outermost]
    for offset in launches:
        i = bisect.bisect_right(starts, offset) - 1
        if i >= 0 and offset < outermost[i].body[1]:
            hits.append((offset, "a kernel launch from device code (dynamic parallelism)", "<<<"))
    if not hits:
        return
    offset, what, token = min(hits)
    function = _enclosing(functions, offset)
    where = "the CUDA source"
    if function is not None:
        where = f"CUDA {'kernel' if function.qualifier == '__global__' else 'device function'} {function.name!r}"
    line = text.count("\n", 0, offset) + 1
    construct = " ".join(token.split()).rstrip("(").rstrip()
    raise NotImplementedError(f"{where} uses {what} ({construct!r}, line {line}): {_WHY}")


def _enclosing(functions, offset):
    """The function definition (from its qualifier to the end of its body) holding `offset`, or None."""
    return next((f for f in functions if f.start <= offset < f.body[1]), None)


def _launch_edits(text, backwards, start, end):
    """Edits turning `kernel<<<config>>>(args)`, its `<<<` at `start` and `>>>` at `end`, into
    `__mt_emu::launch(<call>, config)(args)`; none where the text around is not such a launch (the compiler then
    reports it). `backwards` is `text` reversed."""
    callee = _CALLEE_BACKWARDS.match(backwards, len(text) - start)
    if callee is None or not _CALL.match(text, end + 3):
        return []
    callee_start = len(text) - callee.end()
    name_end = callee_start + len(text[callee_start:start].rstrip())
    lines = "\n" * text.count("\n", name_end, start)
    return [(callee_start, callee_start, "::__mt_emu::launch([&](auto &&...__mt_a) { "),
            (name_end, start + 3, f"(__mt_a...); }}, {lines}"), (end, end + 3, ")")]


def _entry_points(signatures):
    """The extern "C" entry points through which Python launches each launchable kernel."""
    out = []
    for key, signature in signatures.items():
        if signature.kinds is None:
            continue
        kernel = "::" + (f"{signature.scope}::" if signature.scope else "") + signature.name
        out.append(f'\nextern "C" __attribute__((visibility("default"))) void {_entry_name(key)}'
                   f"(const unsigned *dims, void **args) {{\n"
                   f"  ::__mt_emu::Packed<decltype(&{kernel})>::run<&{kernel}>(dims, args);\n}}\n")
    return "".join(out)


def _entry_name(name):
    """The entry point's symbol: C++ kernels' "ns::name" made an identifier."""
    return "__mt_launch_" + re.sub(r"\W", "_", name)


def _check_launchable(name, signature):
    """TypeError where Python cannot launch the kernel: a template, overloads, a parameter without a code."""
    if signature.template:
        raise TypeError(f"CUDA kernel {name!r} is a template; the simulated device launches only non-template "
                        f"kernels from Python (instantiate it in an extern \"C\" kernel)")
    if signature.overloaded:
        raise TypeError(f"CUDA kernel name {name!r} is overloaded (defined more than once), so a launch by name is "
                        f"ambiguous; give each kernel its own name")
    for i, param in enumerate(signature.params):
        if param.kind is None:
            raise TypeError(f"CUDA kernel {name!r} parameter {param.name or f'#{i}'!r} has type {param.ctype!r}, "
                            f"which a launch from Python cannot pass; it can pass {_LAUNCHABLE}")


def _launcher(name, signature, entry):
    """The launch function of one kernel: arguments packed 8 bytes each, a pointer to each passed to `entry`."""
    kinds = signature.kinds
    layout = struct.Struct("=" + "".join(_FORMATS[k] for k in kinds))
    count = len(kinds)

    def prepare(gx, gy, gz, bx, by, bz, *args):
        if len(args) != count:
            names = ", ".join(p.name or f"#{i}" for i, p in enumerate(signature.params))
            raise TypeError(f"CUDA kernel {name!r} takes {count} arguments ({names}), got {len(args)}")
        dims = _dims(name, (gx, gy, gz), (bx, by, bz))
        if dims is None:
            return None
        buffer = ctypes.create_string_buffer(max(layout.size, 8))
        try:
            layout.pack_into(buffer, 0, *args)
        except (struct.error, TypeError, OverflowError):
            raise _argument_error(name, signature, args) from None
        base = ctypes.addressof(buffer)
        pointers = (ctypes.c_void_p * max(count, 1))(*(base + 8 * i for i in range(count)))
        packed = (buffer, pointers)  # the run holds the buffer its pointers point into

        def run():
            entry(dims, packed[1])
        return run
    return prepare


def _dims(name, grid, block):
    """The six launch dimensions as C unsigneds, or None for an empty launch; ValueError past CUDA's limits."""
    values = [operator.index(v) for v in grid + block]
    grid, block = tuple(values[:3]), tuple(values[3:])
    if min(values) < 0:
        raise ValueError(f"CUDA kernel {name!r}: grid {grid} and block {block} must not be negative")
    if 0 in values:
        return None
    threads = block[0] * block[1] * block[2]
    if threads > _MAX_THREADS or any(b > limit for b, limit in zip(block, _BLOCK_LIMITS)):
        raise ValueError(f"CUDA kernel {name!r}: block {block} ({threads} threads) is too large; CUDA allows "
                         f"at most {_MAX_THREADS} threads per block and block dimensions up to {_BLOCK_LIMITS}")
    if any(g > limit for g, limit in zip(grid, _GRID_LIMITS)):
        raise ValueError(f"CUDA kernel {name!r}: grid {grid} is too large; CUDA allows grid dimensions up "
                         f"to {_GRID_LIMITS}")
    return (ctypes.c_uint * 6)(*values)


def _argument_error(name, signature, args):
    """The TypeError or OverflowError naming the first argument that does not fit its parameter."""
    for i, (param, value) in enumerate(zip(signature.params, args)):
        what = f"CUDA kernel {name!r} argument {i} ({param.name or '#' + str(i)}: {param.ctype})"
        integral = isinstance(value, int) and not isinstance(value, bool)
        if not integral and (param.kind in _RANGES or not isinstance(value, (int, float))):
            return TypeError(f"{what} must be {_EXPECTED[param.kind]}, got {type(value).__name__}")
        low, high = _RANGES.get(param.kind, (-math.inf, math.inf))
        if not low <= value < high or param.kind == "f" and math.isfinite(value) and abs(value) > _FLOAT_MAX:
            return OverflowError(f"{what} is out of range: {value}")
    return TypeError(f"CUDA kernel {name!r}: the arguments {args!r} do not fit its parameters")


def _flags(options):
    """The compiler flags of the accepted `options` (see the module's docstring); ValueError for others."""
    items = iter(shlex.split(options) if isinstance(options, str) else [str(o) for o in options])
    flags = []
    for option in items:
        if option in _VALUED or option in _PASSED:  # the value is the next item
            value = next(items, None)
            if value is None:
                raise ValueError(f"CUDA option {option!r} needs a value after it")
            option = f"{option}={value}"
        if option.split("=")[0] in _VALUED or _IGNORED.fullmatch(option):
            continue  # GPU code generation: nothing to do on the CPU
        passed = _PASSED_FORM.fullmatch(option)
        if passed is None:
            raise ValueError(f"CUDA option {option!r} is not supported by the simulated device's emulation: it takes "
                             "-D/-U/-I (macros, include folders) and ignores GPU options such as -arch or --std")
        kind, value = _PASSED[passed.group(1)], passed.group(2)
        flags.append(kind + (os.path.abspath(value) if kind == "-I" else value))
    return tuple(flags)


def _build(text, flags):
    """The path of the shared library of the translated `text`, from the caches or compiled now. A cached library
    is sealed (diskcache) and checked before it is loaded: a damaged one is compiled again."""
    command, version = _compiler(os.environ.get("CXX"))
    prelude = _prelude()
    parts = (text, prelude.decode(), repr(command), version, repr((_FLAGS, flags)), _included(flags))
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    with _lock:
        if key not in _built:
            name = f"cuda-emu-{key}.so"
            library = diskcache.path(name)
            if diskcache.read_sealed(library) is None:
                library = diskcache.writable(name)
                _compile(command, text, flags, prelude, library)
            _built[key] = library
        return _built[key]


def _compile(command, text, flags, prelude, library):
    """Compile `text` with the prelude force-included into `library`; CompileError with the compiler's log."""
    include = _include_folder(prelude)
    source_path = library[:-3] + ".cu"
    diskcache.write(source_path, text.encode())
    output = diskcache.temporary(library) + ".so"
    full = [*command, *_FLAGS, "-include", os.path.join(include, "cuda_emulation.h"), f"-I{include}", *flags,
            "-x", "c++", source_path, "-o", output]
    try:
        proc = subprocess.run(full, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(proc.stderr + proc.stdout, full, source_path)
        with open(output, "rb") as f:
            diskcache.write_sealed(library, f.read())
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(output)


def _include_folder(prelude):
    """A folder holding the prelude and the fake CUDA headers (cuda_runtime.h, cuda.h, ...) that include it: the
    cached one when every file in it is whole, else one written again where the cache can be written."""
    name = f"cuda-emu-include-{hashlib.sha256(prelude).hexdigest()[:16]}"
    files = {"cuda_emulation.h": prelude, **{h: b'#pragma once\n#include "cuda_emulation.h"\n' for h in _HEADERS}}
    folder = diskcache.path(name)
    if all(diskcache.read(os.path.join(folder, file)) == data for file, data in files.items()):
        return folder
    folder = diskcache.writable(name)
    os.makedirs(folder, exist_ok=True)
    for file, data in files.items():
        if diskcache.read(os.path.join(folder, file)) != data:
            diskcache.write(os.path.join(folder, file), data)
    return folder


def _included(flags):
    """Names, sizes and modification times of the files under the -I folders, so an edited header rebuilds."""
    found = []
    for flag in flags:
        if flag.startswith("-I"):
            for root, _, names in sorted(os.walk(flag[2:])):
                found += [_stamp(os.path.join(root, name)) for name in sorted(names)]
    return "\n".join(found)


def _stamp(path):
    try:
        stat = os.stat(path)
    except OSError:  # a dangling link: no header the compiler could read either
        return f"{path}:missing"
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


@functools.lru_cache(maxsize=None)
def _prelude():
    with open(_PRELUDE, "rb") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def _compiler(configured):
    """The host C++ compiler's command ($CXX, else c++, g++ or clang++) and its --version output."""
    command = shlex.split(configured) if configured else []
    if not command:
        command = next(([found] for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), [])
    if not command:
        raise RuntimeError("the simulated device compiles CUDA kernels for the CPU with the host C++ compiler, and "
                           "none was found: install c++, g++ or clang++ on PATH, or set $CXX")
    try:
        version = subprocess.run([*command, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise RuntimeError(f"the host C++ compiler {command[0]!r} ($CXX) cannot be run: {e}") from None
    return tuple(command), version.strip()
