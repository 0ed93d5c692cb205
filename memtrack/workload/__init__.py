"""What user code declares: the `@memtrack.workload` decorator, discovery and selection of
cases, the `Context` a workload receives, and concurrent sessions. Torch-free except `context`."""
