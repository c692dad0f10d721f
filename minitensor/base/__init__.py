"""The ground layer: value types and utilities that import nothing else from minitensor (errors, dtypes, the
device value type, int arguments, the C-extension builder, the disk cache, and the pickle reader bounded by a
file's size that mt.load and the memory viewer share)."""
