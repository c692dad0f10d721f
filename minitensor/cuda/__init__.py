"""`mt.cuda`, as torch.cuda: devices (devices.py), streams and events (streams.py), device memory (memory.py),
pinned host memory (host_memory.py), random generators (random.py), CUDA graphs (graphs.py, capturing.py) and
memory pools (mempool.py), the test helpers sleep and Gate (testing.py), users' CUDA C++ kernels (raw_kernels.py)
and their compile cache (codecache.py). Byte transfers (transfer.py, staging.py) and kernel-found errors
(device_errors.py) serve the layers above."""
from ..base.errors import CompileError, CudaError, OutOfMemoryError
from . import codecache, graphs, host_memory, memory, mempool
from .devices import (backend, check_error, current_device, device, device_count, get_device_capability,
                      get_device_name, get_device_properties, is_available, mem_get_info, set_device, synchronize)
from .host_memory import (host_empty_cache, host_memory_stats, host_register, host_unregister,
                          reset_accumulated_host_memory_stats, reset_peak_host_memory_stats)
from .memory import (caching_allocator_alloc, caching_allocator_delete, empty_cache, get_per_process_memory_fraction,
                     max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved, memory_snapshot,
                     memory_stats, record_memory_history, reset_accumulated_memory_stats, reset_peak_memory_stats,
                     set_allocator_settings, set_oom_snapshot, set_per_process_memory_fraction)
from .graphs import CUDAGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables
from .mempool import MemPool, use_mem_pool
from .raw_kernels import RawKernel, RawModule
from .random import default_generators, initial_seed, manual_seed, manual_seed_all
from .streams import Event, ExternalStream, Stream, current_stream, default_stream, set_stream, stream
from .testing import Gate, sleep

__all__ = sorted({"CompileError", "CudaError", "Event", "ExternalStream", "Gate", "OutOfMemoryError", "RawKernel",
                  "RawModule", "Stream", "backend", "check_error", "current_device", "current_stream", "default_generators", "default_stream", "device",
                  "device_count", "get_device_capability", "get_device_name", "get_device_properties",
                  "initial_seed", "is_available", "manual_seed", "manual_seed_all", "mem_get_info", "set_device",
                  "set_stream", "sleep", "stream", "synchronize", *memory.__all__, *host_memory.__all__,
                  *graphs.__all__, *mempool.__all__})
