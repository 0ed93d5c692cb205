"""The host probe. (The NVML device view is tested in test_nvml.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SPIKE = textwrap.dedent(
    """
    import json, threading, time
    from memtrack.probes.host import HostPeak, current_rss

    def poll(samples, stop, interval):
        while not stop.is_set():
            samples.append(current_rss())
            time.sleep(interval)

    host = HostPeak()
    base = current_rss()
    samples, stop = [], threading.Event()
    time.sleep(0.05)
    host.reset()
    t = threading.Thread(target=poll, args=(samples, stop, 0.2)); t.start()
    time.sleep(0.05)
    spike = bytearray(256 * 2**20)     # touched: zero-filled by the allocator
    spike[::4096] = b"x" * len(spike[::4096])
    del spike                          # ~10 ms alive
    time.sleep(0.5)
    stop.set(); t.join()
    print(json.dumps({"source": host.source, "base": base, "exact": host.peak(),
                      "sampled": max(samples)}))
    """
)


def test_the_exact_host_peak_sees_a_short_spike_that_polling_misses():
    out = subprocess.run([sys.executable, "-c", SPIKE], capture_output=True, text=True, check=True)
    r = __import__("json").loads(out.stdout)
    assert r["source"] == "vmhwm"
    assert r["exact"] - r["base"] >= 250 * 2**20  # the exact high-water mark saw it all
    assert r["sampled"] - r["base"] < 100 * 2**20  # a 200 ms poller missed it
