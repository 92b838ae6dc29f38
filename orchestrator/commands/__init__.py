"""The CLI and one module per command."""
