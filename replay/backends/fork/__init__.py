"""Replay backend for the DeepSeek-V4 fork: runs inside the fork's process (see docs/fork.md); imports the fork lazily."""
