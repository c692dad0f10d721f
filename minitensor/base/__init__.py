"""The ground layer: value types and utilities that import nothing else from minitensor (errors, dtypes, the
device value type, int arguments, the C-extension builder and the disk cache)."""
