"""The ONNX reference evaluator (``onnx.reference.ReferenceEvaluator``) running ONNX's quantization operators.

Covers the quantize-only schemes (docs/conformance.md#quantize-only-cases) with graphs of standard ONNX
operators (opset 21) that the reference evaluator runs (onnx/onnx ``onnx/reference/ops/``:
``op_dynamic_quantize_linear.py``, ``op_quantize_linear.py``, ``op_dequantize_linear.py``):

- ``q-uint8-tensor``: ``DynamicQuantizeLinear(x) -> (y, y_scale, y_zero_point)``, then
  ``DequantizeLinear(y, y_scale, y_zero_point)`` for the dequantized values (float32 input only, as the
  operator's type constraint says);
- ``q-int8-token`` symmetric: per-token int8 from standard operators, the way an exporter writes it:
  ``Cast(x, float) -> Abs -> ReduceMax(axis 1) -> Div(127) -> Reshape([-1])`` gives one fp32 scale a row, and
  ``QuantizeLinear(x, scale, zero_point=int8 zeros, axis=0)`` / ``DequantizeLinear`` (then ``Cast`` to the
  input dtype) do the rest. Every arithmetic step is an ONNX operator; nothing is computed here.

Results and findings: docs/backends/onnx-reference.md.
"""

from __future__ import annotations

import functools

import numpy as np

from .base import Availability, Case, Declared, Support, no, yes
from .quantize_base import QuantizeOnlyBackend

__all__ = ["OnnxReferenceBackend", "OPSET"]

OPSET = 21


@functools.lru_cache(maxsize=1)
def _state():
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
        from onnx.reference import ReferenceEvaluator
    except Exception as e:  # noqa: BLE001
        return None, f"onnx not importable: {type(e).__name__}: {e}"
    return (onnx, TensorProto, helper, numpy_helper, ReferenceEvaluator), ""


_ONNX_DTYPES = {"float32": 1, "float16": 10, "bfloat16": 16}  # TensorProto.FLOAT / FLOAT16 / BFLOAT16


def _model(case: Case):
    onnx, TP, helper, numpy_helper, _ = _state()[0]
    M, K = case.M, case.K
    if case.scheme == "q-uint8-tensor":
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["codes", "scale", "zero_point"]),
                 helper.make_node("DequantizeLinear", ["codes", "scale", "zero_point"], ["dequantized"])]
        inits = []
        outs = [helper.make_tensor_value_info("codes", TP.UINT8, [M, K]),
                helper.make_tensor_value_info("scale", TP.FLOAT, []),
                helper.make_tensor_value_info("zero_point", TP.UINT8, []),
                helper.make_tensor_value_info("dequantized", TP.FLOAT, [M, K])]
        xt = TP.FLOAT
    else:
        xt = _ONNX_DTYPES[case.act_dtype]
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
                 numpy_helper.from_array(np.array(127.0, np.float32), "c127"),
                 numpy_helper.from_array(np.array([-1], np.int64), "flat"),
                 numpy_helper.from_array(np.zeros(M, np.int8), "zp")]
        nodes = [helper.make_node("Cast", ["x"], ["x32"], to=TP.FLOAT),
                 helper.make_node("Abs", ["x32"], ["ax"]),
                 helper.make_node("ReduceMax", ["ax", "axis1"], ["amax"], keepdims=1),
                 helper.make_node("Div", ["amax", "c127"], ["scale2d"]),
                 helper.make_node("Reshape", ["scale2d", "flat"], ["scale"]),
                 helper.make_node("QuantizeLinear", ["x32", "scale", "zp"], ["codes"], axis=0),
                 helper.make_node("DequantizeLinear", ["codes", "scale", "zp"], ["dq32"], axis=0),
                 helper.make_node("Cast", ["dq32"], ["dequantized"], to=xt)]
        outs = [helper.make_tensor_value_info("codes", TP.INT8, [M, K]),
                helper.make_tensor_value_info("scale", TP.FLOAT, [M]),
                helper.make_tensor_value_info("dequantized", xt, [M, K])]
    graph = helper.make_graph(nodes, "qconform_quantize", [helper.make_tensor_value_info("x", xt, [M, K])], outs,
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


class OnnxReferenceBackend(QuantizeOnlyBackend):
    name = "onnx-reference"
    covers = "onnx.reference.ReferenceEvaluator: DynamicQuantizeLinear, QuantizeLinear, DequantizeLinear (opset 21)"
    priority = 5
    SCHEMES = {"q-uint8-tensor": "DynamicQuantizeLinear + DequantizeLinear",
               "q-int8-token": "ReduceMax/Div scale + QuantizeLinear(axis=0) + DequantizeLinear (symmetric only)"}

    def __init__(self, **params: str):
        super().__init__(**params)
        if params:
            raise ValueError(f"onnx-reference: unknown parameter(s) {', '.join(sorted(params))}; it takes none")
        self._sessions: dict = {}

    def availability(self) -> Availability:
        st, why = _state()
        if st is None:
            return Availability(False, why)
        return Availability(True, f"ONNX reference evaluator (NumPy), opset {OPSET}", st[0].__version__, "cpu")

    def _can(self, case: Case) -> Support:
        if case.scheme == "q-uint8-tensor" and case.act_dtype != "float32":
            return no(f"DynamicQuantizeLinear takes float32 input only (type constraint T1), not {case.act_dtype}")
        if case.scheme == "q-int8-token" and not case.sym:
            return no("asymmetric per-token int8 has no ONNX operator graph here (DynamicQuantizeLinear is "
                      "per-tensor uint8); only the symmetric per-token graph is built")
        return yes()

    def declared(self, case: Case) -> Declared:
        v = {}
        if case.scheme == "q-int8-token":
            # a zero row: Div gives scale 0 and QuantizeLinear 0 / 0 = NaN, which np.rint(...).astype(int32)
            # turns into INT32_MIN, clipped to -128 (op_quantize_linear.py); nothing guards it
            v = {"zero_row": "nan", "nan_to_int": "low"}
        return Declared(variants=v, output=case.output_dtype, notes=f"onnx {_state()[0][0].__version__} reference, "
                                                                      f"opset {OPSET}")

    def _quantize(self, case: Case, x: np.ndarray) -> dict:
        key = (case.scheme, case.M, case.K, case.act_dtype)
        if key not in self._sessions:
            self._sessions[key] = _state()[0][4](_model(case))
        if case.act_dtype == "bfloat16":
            import ml_dtypes

            feed = x.astype(ml_dtypes.bfloat16)
        else:
            feed = x.astype(case.act_dtype)
        codes, *rest = self._sessions[key].run(None, {"x": feed})
        if case.scheme == "q-uint8-tensor":
            scale, zp, deq = rest
            return {"codes": np.asarray(codes), "scale": np.asarray(scale).reshape(1),
                    "zero_point": np.asarray(zp).reshape(1), "dequantized": np.asarray(deq)}
        scale, deq = rest
        return {"codes": np.asarray(codes), "scale": np.asarray(scale).reshape(case.M, 1),
                "dequantized": np.asarray(deq).astype(np.float32)}
