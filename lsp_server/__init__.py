"""kspec language server and command-line interface."""
