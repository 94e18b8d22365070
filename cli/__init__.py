"""The `kspec` command line: one entry point for the engine, the language server, the cluster and the benches."""

from kspec.kernels.cpu_cap import apply_to_environment

apply_to_environment()  # before anything imports torch: $KSPEC_CPU holds PyTorch and oneDNN to its level
