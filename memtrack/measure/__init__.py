"""The parent side of a measurement: a case in, a `Measurement` out. One launcher for 1..N
worker processes, the NVML sampler client, the outcome turned into a Measurement, the suite loop
that `run` and `estimate` share, references and snapshots. Nothing here imports torch."""
