"""The language server: documents, cursor -> context, typeahead, settings, edit ranges, JSON-RPC hardening, and the clients that reach an engine."""
