"""The child side: one case in its own process (`python -m memtrack.worker SPEC PID`, or
`memtrack.worker.estimate` under fake tensors). `protocol` is the contract with the parent."""
