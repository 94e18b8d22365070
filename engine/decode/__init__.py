"""Decoding k branches: branch state, sampling, drafters, speculative (BASS) rounds, token healing, stop rules."""
