"""Attention kernels: the bifurcated-attention contract, its PyTorch reference, the Triton kernel."""
