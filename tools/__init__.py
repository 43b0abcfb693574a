"""Developer tools that run outside the package (device measurements)."""
