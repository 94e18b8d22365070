"""The places a completion can be computed, by the names settings and `kspec lsp --engine` use
(the default first). Its own module so that the command line lists them without loading the
language server's protocol types (~0.5 s at every `kspec` start)."""

PLACEMENTS = ("daemon", "inprocess", "remote", "openai")
