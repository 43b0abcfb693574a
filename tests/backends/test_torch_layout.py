"""backends/torch_layout.py: the shared torch-side layout helpers, against hand-written words.

Expected values are written out from the format definitions (docs/formats/gptq.md#packing:
elements 1..8 -> 0x87654321; AutoAWQ's pack order 0,2,4,6,1,3,5,7), not computed by the code.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends import torch_layout as tl  # noqa: E402


def test_awq_orders_are_inverse_permutations():
    assert tl.AWQ_PACK_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    assert [tl.AWQ_PACK_ORDER[tl.AWQ_REVERSE_ORDER[c]] for c in range(8)] == list(range(8))


def test_unpack_sequential_and_awq_order():
    w = torch.tensor([[0x87654321 - 2 ** 32]], dtype=torch.int32)  # the docs' worked word, as int32
    assert tl.unpack_fields(w, 4, 1).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert tl.unpack_fields(w, 4, 0).tolist() == [[1], [2], [3], [4], [5], [6], [7], [8]]
    # AWQ: slot s holds column AWQ_PACK_ORDER[s] (slots 0..7 = columns 0,2,4,6,1,3,5,7), so with
    # slot s holding s + 1, columns 0..7 read slots 0,4,1,5,2,6,3,7
    assert tl.unpack_fields(w, 4, 1, tl.AWQ_REVERSE_ORDER).tolist() == [[1, 5, 2, 6, 3, 7, 4, 8]]
    # 8-bit fields and numpy input
    assert tl.unpack_fields(np.array([[0x04030201]], np.int32), 8, 1).tolist() == [[1, 2, 3, 4]]


def test_pack_is_the_inverse_and_wraps_to_int32():
    w = tl.pack_fields(torch.arange(1, 9).view(1, 8), 4, 1)
    assert w.dtype == torch.int32 and int(w.item()) == 0x87654321 - 2 ** 32
    # two's-complement codes pack as their low nibble (-1 -> 0xF)
    assert int(tl.pack_fields(torch.full((1, 8), -1, dtype=torch.int8), 4, 1).item()) == -1
    v = torch.randint(0, 16, (16, 24), dtype=torch.int32)
    for dim in (0, 1):
        assert torch.equal(tl.unpack_fields(tl.pack_fields(v, 4, dim), 4, dim), v)


def test_torch_dtype_and_to_torch():
    assert tl.torch_dtype("bfloat16") is torch.bfloat16 and tl.torch_dtype("float16") is torch.float16
    with pytest.raises(KeyError, match="int8"):
        tl.torch_dtype("int8")
    import ml_dtypes

    a = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    t = tl.to_torch(a)
    assert t.dtype == torch.bfloat16 and t.tolist() == [1.5, -2.0]
    src = np.arange(4, dtype=np.int32)
    t = tl.to_torch(src, np.float32)
    src[0] = 99  # a copy: the checkpoint array is not aliased
    assert t.dtype == torch.float32 and t.tolist() == [0.0, 1.0, 2.0, 3.0]
