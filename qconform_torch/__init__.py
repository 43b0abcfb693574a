"""qconform's emulator fallback as something a PyTorch model can call.

Semantics: docs/fallback.md.

- ``torch.ops.qconform.quant_linear`` (qconform_torch/op.py): one quantized linear layer, run by the
  dispatcher's choice for its case on this host (backends/registry.py ``select``) or by the canonical
  reference (emulator/layers.py ``linear_layer``);
- ``QuantLinear`` / ``QuantExperts`` / ``QuantGptOssExperts`` (qconform_torch/module.py):
  ``torch.nn.Module`` wrappers built from checkpoint layers;
- ``qconform model`` (qconform_torch/model.py): a whole HF-style quantized checkpoint's forward pass.

Layering: emulator <- backends <- qconform_torch <- conformance (the CLI wires ``qconform model`` in);
nothing here is imported by emulator/ or backends/, and emulator/ stays NumPy-only.
"""

__all__ = ["quant_linear", "QuantLinear", "QuantExperts", "QuantGptOssExperts"]  # noqa: F822 - provided lazily by __getattr__ below


def __getattr__(name: str):
    """Lazy: ``qconform`` builds its parser through qconform_torch.cli without importing torch (a plain
    ``pip install .`` has none); the op is registered when the op or a module is first asked for."""
    if name == "quant_linear":
        from .op import quant_linear

        return quant_linear
    if name in ("QuantLinear", "QuantExperts", "QuantGptOssExperts"):
        from . import module

        return getattr(module, name)
    raise AttributeError(f"module 'qconform_torch' has no attribute {name!r}")
