"""The pure placement core: values in, values out.

Nothing here does I/O or touches asyncio, and nothing here imports the rest of
Tessera (an import-linter contract enforces it). The services wrap it; benchmarks
and property tests drive it directly.
"""
