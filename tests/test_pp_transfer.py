"""The pipeline's stage-to-stage transfer (hvdlite/torch/parallel/pipeline/transfer.py) on two real ranks:
every supported dtype, empty and 0-dim tensors, requires_grad, non-contiguous input, receives
posted before the send and after it, a list too long for the fixed header (the packed
fallback), and lists inside the first message and past its inline room arrive exactly as
sent."""

from helpers import run_pooled


def _payloads(torch):
    g = torch.Generator().manual_seed(3)
    mixed = [
        torch.randn(3, 5, generator=g).requires_grad_(),
        torch.randn(4, 6, generator=g).t(),  # not contiguous
        torch.arange(7, dtype=torch.int64),
        torch.tensor(2.5, dtype=torch.float64),  # 0-dim
        torch.zeros(0, 3),
        torch.tensor([True, False, True]),
        torch.randn(2, 2, generator=g).to(torch.bfloat16),
        torch.arange(5, dtype=torch.uint8),
    ]
    many = [torch.randn(1, 2, i + 1, generator=g) for i in range(20)]  # 1 + 20 * 6 words > 64: packed
    # Past the first message's inline room (p2p.INLINE_BYTES): each tensor its own message;
    # the second list packed, then sent outside the first message.
    large = [torch.randn(64, 300, generator=g), torch.arange(3, dtype=torch.int32)]
    many_large = [torch.randn(40, 20, i + 1, generator=g) for i in range(20)]
    return [mixed, many, large, many_large]


def _body():
    import torch

    import hvdlite.torch as hvd
    from hvdlite.torch.parallel.pipeline import transfer as p2p

    hvd.init()
    ps, got = hvd.global_process_set, []
    for tag, tensors in enumerate(_payloads(torch)):
        if hvd.rank() == 0:
            early = p2p.Incoming(1, 100 + tag, ps)  # posted before the peer sends
            p2p.send(tensors, 1, tag, ps).wait()
            got.append(early.wait())
        else:
            received = p2p.recv(0, tag, ps)  # posted whenever the message is already here or not
            p2p.send(received, 0, 100 + tag, ps).wait()
    hvd.shutdown()
    return [[(t.dtype, t.shape, t.requires_grad, t.detach().float().tolist()) for t in ts] for ts in got]


def test_transfer_round_trip_is_exact():
    import torch

    out = run_pooled(_body, 2, timeout=60)
    want = [
        [(t.dtype, t.shape, t.requires_grad, t.detach().float().tolist()) for t in ts]
        for ts in _payloads(torch)
    ]
    assert out[0] == want
