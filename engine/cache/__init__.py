"""KV caches: the shared prompt prefix stored once plus per-branch KV, and the prefix cache across keystrokes."""
