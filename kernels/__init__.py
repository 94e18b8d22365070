"""Attention kernels: bifurcated (shared prefix + per-branch) attention."""
