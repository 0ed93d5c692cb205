"""The host probe. (The NVML device view is tested in test_nvml.py.)"""

from __future__ import annotations

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
    r = __import__("json").loads(out.stdout)
    assert r["source"] == "vmhwm"
    assert r["exact"] - r["base"] >= 250 * 2**20  # the exact high-water mark saw it all
    assert r["sampled"] - r["base"] < 100 * 2**20  # readings outside the spike missed it
