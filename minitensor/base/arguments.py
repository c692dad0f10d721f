"""Arguments users give as ints (sizes, offsets, indices, handles): any int-like (a Python or numpy int, a 0-d
integer tensor) is taken, anything else (a float, a bool, a string) refused with torch's TypeError, never
truncated."""
import operator


def int_arg(value, what):
    """`value` as an int, or TypeError "<what> must be int, not <type>"."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be int, not {type(value).__name__}")
    return operator.index(value)
