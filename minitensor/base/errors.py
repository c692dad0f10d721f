"""Errors raised by the device layer, shared by both backends, and by the CUDA C++ compilers."""
import os
import re


class CudaError(RuntimeError):
    """A driver call failed; `code` is the CUresult value and `message` the driver's own words for it."""

    def __init__(self, code, message):
        self.code = int(code)
        super().__init__(f"CUDA error {self.code}: {message}")


class OutOfMemoryError(RuntimeError):
    """A device allocation failed after the allocator released what it could."""


class CompileError(RuntimeError):
    """CUDA C++ source failed to compile (nvcc or NVRTC). `log` is the compiler's whole output, `command` the nvcc
    command line or the NVRTC options, `source_path` the cached .cu file (None when there is none), and `lines`
    the (line number, "error" or "warning", message) the log reports about that file, so a caller can point at
    the source."""

    def __init__(self, log, command, source_path=None):
        self.log = log
        self.command = [str(part) for part in command]
        self.source_path = source_path
        self.lines = _diagnostics(log, source_path)
        errors = [f"line {n}: {message}" for n, kind, message in self.lines if kind == "error"]
        first = "; ".join(errors[:3]) or next((line for line in log.splitlines() if line.strip()), "no output")
        where = f" of {source_path}" if source_path else ""
        super().__init__(f"CUDA C++ compilation{where} failed: {first}. Compiler arguments: {' '.join(self.command)}. "
                         f"Compiler output:\n{log}")

    def __reduce__(self):  # the default calls __init__ with the message alone: a worker's error could not cross
        return type(self), (self.log, self.command, self.source_path)


# `file.cu(12): error: ...` (nvcc's front end; NVRTC names the file as the program), `catastrophic error` (a missing
# include), `warning #177-D: ...`, and the host compiler's `file.cu:12:5: error: ...` for host code nvcc passes on
_DIAGNOSTIC = re.compile(
    r"^(\S.*?)(?:\((\d+)\)|:(\d+):\d+): (?:catastrophic |fatal )?(error|warning)(?: #[\w-]+)?: (.*)$", re.M)


def _diagnostics(log, source_path):
    """The diagnostics about the source itself: a header's, or NVRTC's `__nv_name_map` for a bad name expression,
    have line numbers of another text (they stay in the log)."""
    names = {source_path, os.path.basename(source_path)} if source_path else None
    return [(int(front or host), kind, message.strip()) for file, front, host, kind, message in _DIAGNOSTIC.findall(log)
            if names is None or file in names]
