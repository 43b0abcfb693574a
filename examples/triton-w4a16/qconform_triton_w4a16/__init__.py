"""qconform backend plugin: a Triton W4A16 kernel for GPTQ-layout int4 weights."""

__version__ = "0.1.0"
