"""Developer tools: benchmarks, demo data, store helpers. Not installed with the library."""
