"""The engine as a process: runner, daemon, wire protocol, HTTP / OpenAI API, Ray Serve deployment and routing."""
