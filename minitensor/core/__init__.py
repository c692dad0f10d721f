"""What tensors are made of, below the ops: the C fields of Tensor and UntypedStorage (fields.py), storages
(storage.py), layout numbers (layout.py), shape arithmetic (shapes.py) and numpy over CPU memory
(host_arrays.py)."""
