"""qconform's bit-exact reference emulator (NumPy only).

Every quantized format qconform knows is *defined* here; docs/formats.md is
the prose version of the same semantics, with the public source of each fact.
Nothing under this package imports torch.
"""

__version__ = "0.1.0"
