"""The host probe. (The NVML device view is tested in test_nvml.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SPIKE = textwrap.dedent(
    """
    import json
    from memtrack.probes.host import HostPeak, current_rss

    host = HostPeak()
    host.reset()
    base = current_rss()
    # A sampler reads the RSS at its ticks; however long the spike lives on a loaded
    # machine, these two readings fall outside it, as a poller's do for a short spike.
    samples = [current_rss()]
    spike = bytearray(256 * 2**20)     # touched: zero-filled by the allocator
    spike[::4096] = b"x" * len(spike[::4096])
    del spike
    samples.append(current_rss())
    print(json.dumps({"source": host.source, "base": base, "exact": host.peak(),
                      "sampled": max(samples)}))
    """
)


def test_the_exact_host_peak_sees_a_short_spike_that_sampling_misses():
    out = subprocess.run([sys.executable, "-c", SPIKE], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert r["source"] == "vmhwm"
    assert r["exact"] - r["base"] >= 250 * 2**20  # the exact high-water mark saw it all
    assert r["sampled"] - r["base"] < 100 * 2**20  # readings outside the spike missed it


HOLES = textwrap.dedent(
    """
    import json
    import sys
    from memtrack.probes.host import free_heap_bytes
    from memtrack.probes.span import HEAP_KEPT_BYTES, SpanProbe, prime_profiler

    CHUNK = 64 * 1024  # under glibc's mmap threshold: from the heap, freed back to it

    def touched(n):
        blocks = [bytearray(CHUNK) for _ in range(n)]
        for b in blocks:
            b[::4096] = b"x" * len(b[::4096])
        return blocks

    def holes(mib):
        # every other block freed: holes in the heap, resident, that glibc cannot trim
        # from its top
        blocks = touched(2 * mib * 16)
        kept = blocks[1::2]
        del blocks[::2], blocks
        return kept

    prime_profiler()  # as an earlier test did: its set-up is not this span's
    kept = holes(int(sys.argv[1]))  # what earlier tests freed
    free = free_heap_bytes()
    probe = SpanProbe("cpu")
    with probe.span():
        grown = touched(12 * 16)
    rise = probe.figures.host_rise_bytes
    print(json.dumps({"kept": HEAP_KEPT_BYTES, "free": free, "rise": rise}))
    """
)


def test_what_earlier_code_freed_hides_at_most_the_host_floor_of_a_spans_growth():
    # A span (a test in pytest's process) that grows by 12 MiB after earlier code left 16 MiB
    # of free heap: that heap is given back first (but the page of each free block that holds
    # glibc's header), and the growth reads within the floor; with less free heap than the
    # floor, it is left in place and hides at most the floor.
    def span_after(earlier_mib: int) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", HOLES, str(earlier_mib)],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout)

    mib = 2**20
    big, small = span_after(16), span_after(1)
    assert big["free"] >= 16 * mib > big["kept"]
    assert 12 * mib - big["kept"] <= big["rise"] <= 13 * mib, big  # left in place: 4 KiB
    assert small["free"] < small["kept"]
    assert 12 * mib - small["kept"] <= small["rise"] <= 13 * mib, small


def test_a_span_leaves_torchs_profiler_working_for_the_code_after_it():
    # The span switches its thread's op callbacks off (its profiler wants only the
    # allocator's events) and on again: a profiler started after it sees the ops.
    import torch

    from memtrack.probes.span import SpanProbe

    probe = SpanProbe("cpu")
    with probe.span():
        kept = torch.ones(1024, 1024)  # 4 MiB
    assert probe.figures is not None and probe.figures.allocated_bytes == 4 * 2**20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.mm(kept, kept)
    assert "aten::mm" in {e.key for e in prof.key_averages()}
