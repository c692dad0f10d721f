"""Checkpoints: mt.save / mt.load in torch's zip format (api.py) over zipformat.py, crc32.py and base/atomicfile.py,
the pickle writer (torch_pickle.py) and the restricted reader (unpickler.py, allowlist.py); safetensors files
(safetensors.py)."""
