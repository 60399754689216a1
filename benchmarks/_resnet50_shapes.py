"""The 161 parameter tensors of ResNet-50 (torchvision's layout), without torchvision.

SHAPES lists them in torchvision's named_parameters() order: conv1, bn1, then layer1..layer4
of Bottleneck blocks (3, 4, 6, 3 of them; conv1 1x1, conv2 3x3, conv3 1x1 with expansion 4,
each conv followed by a batch norm's weight and bias; the first block of every layer adds a
1x1 downsample conv + batch norm), then fc (2048 -> 1000, weight and bias). Convolutions have
no bias. 25,557,032 float32 values, 97.5 MiB.
"""

EXPANSION = 4
LAYERS = ((64, 3), (128, 4), (256, 6), (512, 3))  # (planes, blocks) of layer1..layer4
NUM_CLASSES = 1000


def _bn(channels):
    return [(channels,), (channels,)]  # weight, bias


def _bottleneck(inplanes, planes, downsample):
    out = planes * EXPANSION
    shapes = [(planes, inplanes, 1, 1)] + _bn(planes)
    shapes += [(planes, planes, 3, 3)] + _bn(planes)
    shapes += [(out, planes, 1, 1)] + _bn(out)
    if downsample:
        shapes += [(out, inplanes, 1, 1)] + _bn(out)
    return shapes


def resnet50_shapes():
    """The parameter shapes, in torchvision's order."""
    shapes = [(64, 3, 7, 7)] + _bn(64)
    inplanes = 64
    for planes, blocks in LAYERS:
        for i in range(blocks):
            shapes += _bottleneck(inplanes, planes, downsample=(i == 0))
            inplanes = planes * EXPANSION
    shapes += [(NUM_CLASSES, inplanes), (NUM_CLASSES,)]
    return shapes


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


SHAPES = resnet50_shapes()
TOTAL = sum(_numel(s) for s in SHAPES)
assert len(SHAPES) == 161, len(SHAPES)
assert TOTAL == 25557032, TOTAL
