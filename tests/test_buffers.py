"""The adapters' buffer descriptions (hvdlite/common/buffer.py): what each adapter's describe()
hands the shared code, made once per tensor. No ranks: describe() never reaches the core."""

import numpy as np
import pytest
import torch

from hvdlite.common import buffer, dtypes, exceptions
from hvdlite.common.numpy_buffers import NUMPY
from hvdlite.torch.buffers import TORCH


def _fields(description):
    assert isinstance(description, tuple) and len(description) == len(buffer.FIELDS)
    return dict(zip(buffer.FIELDS, description))


def test_a_contiguous_array_is_handed_over_as_it_is():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = _fields(NUMPY.describe(a, "a"))
    assert d["data"] is a and d["tensor"] is a and d["work"] is a
    assert (d["code"], tuple(d["shape"]), d["device"], d["stream"]) == (dtypes.FLOAT32, (2, 3), -1, 0)
    assert buffer.nbytes(d["code"], d["shape"]) == 24 and buffer.address(d["data"]) == a.ctypes.data
    out = d["wrap"](np.arange(2, dtype=np.float32).view(np.uint8), (2,), a)
    assert out.dtype == np.float32 and out.tolist() == [0.0, 1.0]
    assert d["wrap"](None, (0, 3), a).shape == (0, 3)


def test_a_strided_array_goes_through_a_copy_assigned_back():
    base = np.zeros((4, 3), np.float64)
    view = base[::2]
    d = _fields(NUMPY.describe(view, "v"))
    assert d["tensor"] is view and d["work"] is not view and d["data"] is d["work"]
    assert d["work"].flags.c_contiguous
    d["work"][...] = 7.0  # what the core would write
    d["assign"](view, d["work"])
    assert base[::2].tolist() == [[7.0] * 3] * 2 and base[1::2].sum() == 0.0


def test_a_tensor_is_handed_over_by_address():
    t = torch.arange(4.0)
    d = _fields(TORCH.describe(t, "t"))
    assert d["work"] is t and d["data"] == t.data_ptr() and buffer.address(d["data"]) == t.data_ptr()
    assert (d["code"], tuple(d["shape"]), d["device"], d["stream"]) == (dtypes.FLOAT32, (4,), -1, 0)
    out = d["wrap"](np.arange(2, dtype=np.float32).view(np.uint8), (1, 2), t)
    assert out.dtype == torch.float32 and out.tolist() == [[0.0, 1.0]]
    assert d["wrap"](None, (0,), t).dtype == torch.float32


def test_a_transposed_tensor_is_copied_and_assign_rounds_outside_autograd():
    w = torch.zeros(3, 2, requires_grad=True)
    t = w.detach().t()
    d = _fields(TORCH.describe(t, "t"))
    assert d["work"] is not t and d["work"].is_contiguous() and d["data"] == d["work"].data_ptr()
    d["work"].fill_(2.0)
    d["assign"](t, d["work"])
    assert t.tolist() == [[2.0] * 3] * 2
    half = torch.zeros(2, dtype=torch.float16)
    d["assign"](half, np.array([1.0 / 3, 2.0]))  # float64 values, rounded to float16
    assert half.tolist() == [torch.tensor(1.0 / 3).half().item(), 2.0]


@pytest.mark.parametrize(
    "adapter, tensor, error, words",
    [
        (NUMPY, np.zeros(2, np.complex64), exceptions.NotSupportedError, ("'x'", "complex64", "float32")),
        (TORCH, torch.zeros(2, dtype=torch.complex64), exceptions.NotSupportedError, ("'x'", "complex64")),
        (TORCH, torch.zeros(2, device="meta"), exceptions.NotSupportedError, ("'x'", "meta", ".cpu()")),
        (TORCH, torch.zeros(2).to_sparse(), exceptions.InvalidArgumentError, ("'x'", "sparse")),
    ],
)
def test_what_the_core_cannot_take_is_refused_naming_the_tensor(adapter, tensor, error, words):
    with pytest.raises(error) as info:
        adapter.describe(tensor, "x")
    assert all(w in str(info.value) for w in words), str(info.value)
