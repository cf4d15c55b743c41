"""Evolution layers: one generation function per file."""
