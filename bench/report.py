"""Plain-text tables of the results; the JSON file holds the same numbers unrounded."""

from bench.table import table
from bench.targets import add_vs_copy, best_copy

BASELINES = ("torch", "cupy")
RATIO_HELP = ("speed ratio mt_vs_X = X_time / minitensor_time: > 1 means minitensor is faster "
              "(for bandwidth: minitensor GB/s / X GB/s)")


def error_text(exc):
    """A failed measurement, as the table and the JSON record it: the exception's first line."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def add_times(row, times, errors):
    """A row's measured times and, for each contender that failed, its error."""
    row["time"].update(times)
    row["errors"].update({label: error_text(exc) for label, exc in errors.items()})


def shape_text(shape):
    if len(shape) == 1 and shape[0] >= 2**16 and shape[0] & (shape[0] - 1) == 0:
        return f"2^{shape[0].bit_length() - 1}"
    return "x".join(map(str, shape))


def _gbps(value):
    """GB/s with three significant digits at least: the simulated device runs well under 1 GB/s."""
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def _num(value, fmt):
    """`fmt` is a function from number to text, e.g. "{:.2f}".format."""
    return "n/a" if value is None else fmt(value)


def _cell(row, fw, value, fmt):
    """A measured figure, ERR when that framework failed, n/a when it did not run."""
    return "ERR" if fw in row["errors"] else _num(value, fmt)


def _ratios(row):
    return [_num(row["ratios"].get(f"mt_vs_{b}"), "{:.2f}x".format) for b in BASELINES]


def _status(row, verdicts):
    return "/".join(v["status"] for v in verdicts if v["case"] == row["key"])


def host_section(rows, verdicts):
    header = ["host latency", "size", "minitensor us", "torch us", "cupy us",
              "mt_vs_torch", "mt_vs_cupy", "target"]
    body = [[r["name"], shape_text(r["shape"]),
             *(_cell(r, fw, r["time"].get(fw), "{:.2f}".format) for fw in ("minitensor", *BASELINES)),
             *_ratios(r), _status(r, verdicts)] for r in rows]
    return table(header, body)


def device_section(rows, verdicts):
    header = ["device bandwidth", "size", "minitensor ms", "minitensor GB/s", "torch GB/s",
              "cupy GB/s", "mt_vs_torch", "mt_vs_cupy", "target"]
    body = []
    for r in rows:
        mt_s = r["time"].get("minitensor")
        body.append([r["name"], shape_text(r["shape"]),
                     _cell(r, "minitensor", None if mt_s is None else mt_s * 1e3, "{:.3f}".format),
                     *(_cell(r, fw, r["gbps"].get(fw), _gbps) for fw in ("minitensor", *BASELINES)),
                     *_ratios(r), _status(r, verdicts)])
    return table(header, body)


def bandwidth_section(title, columns, ratio_keys, rows, verdicts):
    """A table of rows that move r["bytes"]: GB/s for each of `columns`, then the ratios `ratio_keys`."""
    header = [title, "size", *(f"{c} GB/s" for c in columns), *ratio_keys, "target"]
    body = []
    for r in rows:
        gbps = [("ERR" if c in r["errors"] else "n/a" if c not in r["gbps"] else f"{r['gbps'][c]:.3g}")
                for c in columns]
        ratios = [f"{r['ratios'][k]:.2f}x" if k in r["ratios"] else "n/a" for k in ratio_keys]
        body.append([r["name"], f"{r['bytes'] / 2**20:.0f} MiB", *gbps, *ratios, _status(r, verdicts)])
    return table(header, body)


def add_vs_copy_line(rows_by_key):
    """Add's bandwidth against the best D2D copy of this run, the 'add at copy speed' check."""
    copy, fraction = best_copy(rows_by_key), add_vs_copy(rows_by_key)
    if fraction is None:
        return "add / D2D copy bandwidth: n/a"
    add = rows_by_key["device.add_out"]["gbps"]["minitensor"]
    return (f"add / D2D copy bandwidth: minitensor add {_gbps(add)} GB/s / best copy {_gbps(copy[0])} GB/s "
            f"({copy[1]} copy_) = {fraction:.3f} (target >= 0.90)")


def startup_section(rows, verdicts):
    header = ["start-up", "minitensor s", "torch s", "mt_vs_torch", "target"]
    body = [[r["name"], *(_cell(r, fw, r["time"].get(fw), "{:.3f}".format) for fw in ("minitensor", "torch")),
             _num(r["ratios"].get("mt_vs_torch"), "{:.2f}x".format), _status(r, verdicts)] for r in rows]
    return table(header, body)


def errors_section(rows):
    lines = [f"  {r['key']} [{fw}]: {msg}" for r in rows for fw, msg in r["errors"].items()]
    return "errors:\n" + "\n".join(lines) if lines else ""


def summary(verdicts):
    body = [[v["name"], v["measured_text"], v["target"], v["status"]] for v in verdicts]
    return table(["target", "measured", "wanted", "result"], body)
