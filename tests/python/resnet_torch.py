"""meshtrain's ResNet (meshtrain/nn/resnet.h) in plain torch.nn, with torchvision's module names
and structure (conv1, bn1, layerK.B.convN / bnN, layerK.0.downsample.0 / .1, fc), so that a state
dict moves between the two and, for resnet18 and resnet50, into torchvision's models as it is.
torchvision itself is not needed (Debian ships python3-torch without it).

Configs, as meshtrain's resnet_config names them:
  small     28x28 stem (3x3 stride-1 convolution, no max pool), basic blocks [2, 2, 2], width 16
  tiny      the small stem, basic blocks [1, 1, 1], width 4 (tests)
  resnet18  ImageNet stem (7x7 stride-2 convolution, 3x3 stride-2 max pool), basic [2, 2, 2, 2],
            width 64
  resnet50  ImageNet stem, bottleneck blocks [3, 4, 6, 3] (stride on the 3x3, torchvision's v1.5),
            width 64
Batch norm: eps 1e-5, momentum 0.1 (PyTorch's defaults, as meshtrain's). Convolutions have no
bias; padding is kernel // 2.

Initialisation follows meshtrain's, not torchvision's kaiming_normal re-initialisation: the
convolutions keep PyTorch's layer default (Kaiming-uniform with a = sqrt(5)), batch norm weight 1
and bias 0, fc weight ~ N(0, 1 / sqrt(in)) and bias 0. Only the distributions agree (the two draw
from different generators); load a state dict for the same numbers.

    import resnet_torch
    model = resnet_torch.resnet("tiny", in_channels=1, num_classes=10)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BASIC, BOTTLENECK = "basic", "bottleneck"


def config(name, in_channels=None, num_classes=None):
    """The named config as a dict (block, blocks, width, in_channels, num_classes, imagenet_stem);
    in_channels and num_classes default to the config's own."""
    small = dict(block=BASIC, blocks=[2, 2, 2], width=16, in_channels=1, num_classes=10,
                 imagenet_stem=False)
    configs = {
        "small": small,
        "tiny": dict(small, blocks=[1, 1, 1], width=4),
        "resnet18": dict(block=BASIC, blocks=[2, 2, 2, 2], width=64, in_channels=3,
                         num_classes=1000, imagenet_stem=True),
        "resnet50": dict(block=BOTTLENECK, blocks=[3, 4, 6, 3], width=64, in_channels=3,
                         num_classes=1000, imagenet_stem=True),
    }
    if name not in configs:
        raise ValueError(f"no ResNet named {name!r}; choose " + ", ".join(configs))
    c = dict(configs[name])
    if in_channels is not None:
        c["in_channels"] = in_channels
    if num_classes is not None:
        c["num_classes"] = num_classes
    return c


def _conv(cin, cout, kernel, stride):
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, inner, stride):
        super().__init__()
        self.conv1 = _conv(cin, inner, 3, stride)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = _conv(inner, inner, 3, 1)
        self.bn2 = nn.BatchNorm2d(inner)
        self.downsample = _downsample(cin, inner, stride)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, inner, stride):
        super().__init__()
        out = inner * 4
        self.conv1 = _conv(cin, inner, 1, 1)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = _conv(inner, inner, 3, stride)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = _conv(inner, out, 1, 1)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = _downsample(cin, out, stride)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


def _downsample(cin, out, stride):
    """The shortcut's 1x1 convolution and batch norm where the shape changes (None: identity)."""
    if stride == 1 and cin == out:
        return None
    return nn.Sequential(_conv(cin, out, 1, stride), nn.BatchNorm2d(out))


class ResNet(nn.Module):
    def __init__(self, block, blocks, width, in_channels, num_classes, imagenet_stem):
        super().__init__()
        Block = Bottleneck if block == BOTTLENECK else BasicBlock
        self.imagenet_stem = imagenet_stem
        self.conv1 = _conv(in_channels, width, 7 if imagenet_stem else 3,
                           2 if imagenet_stem else 1)
        self.bn1 = nn.BatchNorm2d(width)
        channels = width
        for s, n in enumerate(blocks):
            stage = []
            for b in range(n):
                stride = 2 if s > 0 and b == 0 else 1
                stage.append(Block(channels, width << s, stride))
                channels = (width << s) * Block.expansion
            setattr(self, f"layer{s + 1}", nn.Sequential(*stage))
        self.stages = len(blocks)
        self.fc = nn.Linear(channels, num_classes)
        with torch.no_grad():
            self.fc.weight.normal_(0.0, channels ** -0.5)
            self.fc.bias.zero_()

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        if self.imagenet_stem:
            h = F.max_pool2d(h, 3, 2, 1)
        for s in range(self.stages):
            h = getattr(self, f"layer{s + 1}")(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def resnet(name, in_channels=None, num_classes=None):
    """The named ResNet (see config)."""
    return ResNet(**config(name, in_channels, num_classes))
