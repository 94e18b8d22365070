"""kspec engine: model runtime, decoding, prompt building and post-processing."""
