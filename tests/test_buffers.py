"""The adapters' Buffer records (hvdlite/common/buffer.py): what each adapter's describe() hands
the shared code, made once per tensor. No ranks: describe() never reaches the core."""

import numpy as np
import pytest
import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.common.numpy_buffers import NUMPY
from hvdlite.torch.buffers import TORCH


def test_a_contiguous_array_is_handed_over_as_it_is():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = NUMPY.describe(a, "a")
    assert buf.data is a and buf.tensor is a and buf.direct
    assert (buf.code, tuple(buf.shape), buf.device, buf.stream) == (dtypes.FLOAT32, (2, 3), -1, 0)
    assert buf.nbytes() == 24 and buf.address() == a.ctypes.data
    assert buf.keepalive == (a, a)
    buf.copy_back()  # nothing to write back
    out = buf.wrap(np.arange(2, dtype=np.float32).view(np.uint8), (2,))
    assert out.dtype == np.float32 and out.tolist() == [0.0, 1.0]
    assert buf.wrap(None, (0, 3)).shape == (0, 3)


def test_a_strided_array_goes_through_a_copy_written_back():
    base = np.zeros((4, 3), np.float64)
    view = base[::2]
    buf = NUMPY.describe(view, "v")
    assert not buf.direct and buf.work.flags.c_contiguous and buf.data is buf.work
    buf.work[...] = 7.0  # what the core would write
    buf.copy_back()
    assert base[::2].tolist() == [[7.0] * 3] * 2 and base[1::2].sum() == 0.0


def test_a_tensor_is_handed_over_by_address():
    t = torch.arange(4.0)
    buf = TORCH.describe(t, "t")
    assert buf.direct and buf.data == t.data_ptr() and buf.address() == t.data_ptr()
    assert (buf.code, tuple(buf.shape), buf.device) == (dtypes.FLOAT32, (4,), -1)
    out = buf.wrap(np.arange(2, dtype=np.float32).view(np.uint8), (1, 2))
    assert out.dtype == torch.float32 and out.tolist() == [[0.0, 1.0]]
    assert buf.wrap(None, (0,)).dtype == torch.float32


def test_a_transposed_tensor_is_copied_and_assign_rounds_outside_autograd():
    w = torch.zeros(3, 2, requires_grad=True)
    t = w.detach().t()
    buf = TORCH.describe(t, "t")
    assert not buf.direct and buf.work.is_contiguous() and buf.data == buf.work.data_ptr()
    buf.work.fill_(2.0)
    buf.copy_back()
    assert t.tolist() == [[2.0] * 3] * 2
    half = torch.zeros(2, dtype=torch.float16)
    TORCH.describe(half, "h").assign(half, np.array([1.0 / 3, 2.0]))  # float64 values, rounded
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
