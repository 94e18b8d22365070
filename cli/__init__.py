"""The `kspec` command line: one entry point for the engine, the language server, the cluster and the benches."""
