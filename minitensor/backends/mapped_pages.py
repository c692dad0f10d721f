"""The pages a driver has mapped into the address ranges of expandable segments (backends/nvidia.py, sim_vmm.py),
address -> size: the run of them that holds an address (what memory_range reports), the pages that make up a range
exactly (what vmm_unmap may take), and whether any overlaps a range (what vmm_map and vmm_release refuse)."""


class MappedPages(dict):
    def run(self, ptr):
        """(start, size) of the run of consecutive pages that holds `ptr`, or None."""
        start = next((at for at, size in self.items() if at <= ptr < at + size), None)
        if start is None:
            return None
        starts_by_end = {at + size: at for at, size in self.items()}
        end = start + self[start]
        while start in starts_by_end:
            start = starts_by_end[start]
        while end in self:
            end += self[end]
        return start, end - start

    def tiling(self, ptr, nbytes):
        """The addresses of the pages that make up [ptr, ptr + nbytes) exactly, or None."""
        starts, at = [], ptr
        while at < ptr + nbytes and at in self:
            starts.append(at)
            at += self[at]
        return starts if nbytes > 0 and at == ptr + nbytes else None

    def overlaps(self, start, end):
        return any(at < end and start < at + size for at, size in self.items())
