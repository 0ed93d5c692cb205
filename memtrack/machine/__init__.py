"""The machine: the environment fingerprint (GPUs, driver, CUDA, torch, packages), git and
CI provenance, and `doctor`'s checks of whether the machine can be trusted."""
