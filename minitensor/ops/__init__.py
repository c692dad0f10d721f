"""The ops: argument checks and torch's typing rules here, the work in Triton kernels for cuda tensors
(minitensor.kernels) and numpy for CPU tensors. typing.py (result types, devices, out= checks), pointwise.py
(unary, binary, where, clamp) over runs.py (their cuda fast paths), reductions.py, indexing.py (gather,
index_select, item assignment), random.py, copy.py (copy_ and fill_), format.py (repr)."""
