"""Example vendor plugin for qconform: a W4A16 GPTQ kernel registered through an entry point."""

__version__ = "0.1.0"
