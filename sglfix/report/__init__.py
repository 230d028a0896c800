"""Reports of a run: JSON for machines, rich tables for people, files written atomically."""
