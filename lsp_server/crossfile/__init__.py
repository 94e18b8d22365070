"""Context beyond the cursor's window: chunks of the other open documents of the same workspace
folder and of recently edited places, and the definitions the file imports, under a budget, kept
stable across keystrokes (gatherer.py). Pure text analysis with tree-sitter, plus reading the
workspace folder's files for imports; nothing here talks to an engine."""
