"""Record the allocator's history over a small workload, then write torch's snapshot pickle and minitensor's
offline viewer page:

    python examples/memory_history.py [out_dir]      # snapshot.pickle and memory.html in out_dir (default: .)

Open memory.html in any browser (it needs no network); torch users can also load snapshot.pickle into
pytorch.org/memory_viz or `python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o torch.html`.
"""
import os
import sys

import minitensor as mt
from minitensor import memory_viz


def workload():
    """A growing batch of activations, freed and made again, with a side stream's work in between."""
    kept = []
    for step in range(1, 9):
        x = mt.rand(step * 4096, device="cuda")
        y = (x * 2 + 1).sum()
        kept.append(mt.empty(step * 16384, device="cuda"))
        if step % 3 == 0:
            kept.pop(0)
        with mt.cuda.stream(mt.cuda.Stream()):
            z = mt.zeros(8192, device="cuda")
        del x, y, z
    return kept


def main(out_dir="."):
    mt.cuda.memory._record_memory_history(max_entries=100_000)
    kept = workload()
    snapshot = os.path.join(out_dir, "snapshot.pickle")
    mt.cuda.memory._dump_snapshot(snapshot)
    mt.cuda.memory._record_memory_history(enabled=None)
    page = os.path.join(out_dir, "memory.html")
    memory_viz.write_html(snapshot, page)
    print(f"{len(kept)} tensors kept; wrote {snapshot} and {page}")


if __name__ == "__main__":
    main(*sys.argv[1:])
