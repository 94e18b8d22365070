"""The engine: one request from prompt to ranked alternatives (models, caches, decoding, syntax) and serving it."""
