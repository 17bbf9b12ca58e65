"""Small architecture stand-ins for convert tests (random weights, no downloads).

PyTorch factories are named `make_*` (with `example_inputs_*` beside them); tf-keras builders `keras_*`.
Widths are cut down so exports stay fast; the structure (residual blocks, inverted residuals with depthwise
convolutions, attention with masks, LSTM) is what matters for the exporters.
"""
from __future__ import annotations

import torch
from torch import nn

torch.manual_seed(0)


# ------------------------------------------------------------------------------------------- PyTorch


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18 layout (stem, 4 stages x 2 basic blocks, global pool, fc) at a quarter of the width."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, input):  # noqa: A002
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(input)), 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 layout (inverted residuals, depthwise convs, ReLU6) at width 0.25 with fewer repeats."""

    def __init__(self, classes=10):
        super().__init__()
        cfg = [(1, 8, 1, 1), (6, 8, 2, 2), (6, 16, 2, 2), (6, 24, 2, 2), (6, 32, 1, 1)]
        layers = [nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6()]
        cin = 8
        for t, c, n, s in cfg:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 128, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(128, classes))

    def forward(self, input):  # noqa: A002
        return self.classifier(self.features(input).mean((2, 3)))


class TinyEncoder(nn.Module):
    """Token embedding + 2 transformer encoder layers with a key padding mask; dynamic sequence length."""

    def __init__(self, vocab=100, dim=32, heads=4, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids, attention_mask):
        pad = attention_mask == 0
        h = self.encoder(self.embed(input_ids), src_key_padding_mask=pad)
        keep = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


class SentenceEncoder(nn.Module):
    """A sentence-transformer shape: token embeddings + positions, encoder layers over a padded batch, and two
    outputs: the token states and a mask-aware mean-pooled, normalized sentence embedding."""

    def __init__(self, vocab=1000, dim=64, heads=4, layers=2, max_len=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        for block in self.encoder.layers:  # TransformerEncoder clones one layer: give each its own weights, as a
            block.self_attn._reset_parameters()  # trained model has (shared ones export as one tensor + Identity)
            for m in block.modules():
                if isinstance(m, nn.Linear):
                    m.reset_parameters()

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        h = self.encoder(self.embed(input_ids) + self.pos(positions), src_key_padding_mask=attention_mask == 0)
        keep = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return h, nn.functional.normalize(pooled, dim=-1)


class StatefulGRU(nn.Module):
    """A streaming GRU: a chunk [batch, T, F] and a state [layers, batch, hidden] in; a score and the next state
    out (the state's batch axis is its second, as in voice models)."""

    def __init__(self, features=16, hidden=32, layers=2):
        super().__init__()
        self.gru = nn.GRU(features, hidden, layers, batch_first=True)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, chunk, state):
        out, state_n = self.gru(chunk, state)
        return torch.sigmoid(self.fc(out[:, -1])), state_n


class TinyLSTM(nn.Module):
    """An LSTM over [N, T, F] with a classifier on the last step."""

    def __init__(self, features=12, hidden=24, classes=4):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, input):  # noqa: A002
        out, _ = self.lstm(input)
        return self.fc(out[:, -1])


def _eval(model):
    torch.manual_seed(0)
    for m in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def make_resnet18():
    torch.manual_seed(0)
    return _eval(ResNet18())


def make_mobilenetv2():
    torch.manual_seed(0)
    return _eval(MobileNetV2())


def make_encoder():
    torch.manual_seed(0)
    return TinyEncoder().eval()


def make_lstm():
    torch.manual_seed(0)
    return TinyLSTM().eval()


def make_sentence_encoder(**kw):
    torch.manual_seed(0)
    return SentenceEncoder(**kw).eval()


def make_stateful_gru():
    torch.manual_seed(0)
    return StatefulGRU().eval()


def padded_sentences(n=32, seq=64, vocab=1000, seed=0):
    """Token ids padded to `seq` (pad id 0) with lengths 6..seq/2, like tokenized sentences in a batch."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(6, seq // 2 + 1, size=n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(1, vocab, size=(n, seq)), 0).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def export_onnx(model, args, path, input_names, output_names, dynamic_axes):
    """torch.onnx's TorchScript exporter (opset 17): deterministic names and the dynamic axes given."""
    torch.onnx.export(model, args, str(path), input_names=input_names, output_names=output_names,
                      dynamic_axes=dynamic_axes, opset_version=17, dynamo=False)
    return path


def encoder_data(n=6, seq=10, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 100, size=(n, seq)).astype(np.int64)
    lengths = rng.integers(3, seq + 1, size=n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


# ------------------------------------------------------------------------------------------- tf-keras


def keras_resnet(tf_keras):
    L = tf_keras.layers
    tf_keras.utils.set_random_seed(0)
    x = inp = L.Input((64, 64, 3), name="input")
    x = L.Conv2D(16, 7, 2, "same", use_bias=False)(x)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.MaxPool2D(3, 2, "same")(x)
    for i, c in enumerate((16, 32, 64, 128)):
        for j in range(2):
            stride = 2 if i and not j else 1
            y = L.Conv2D(c, 3, stride, "same", use_bias=False)(x)
            y = L.ReLU()(L.BatchNormalization()(y))
            y = L.BatchNormalization()(L.Conv2D(c, 3, 1, "same", use_bias=False)(y))
            sc = x if stride == 1 and x.shape[-1] == c else L.Conv2D(c, 1, stride, use_bias=False)(x)
            x = L.ReLU()(L.Add()([y, sc]))
    x = L.Dense(10)(L.GlobalAveragePooling2D()(x))
    return tf_keras.Model(inp, x)


def keras_mobilenetv2(tf_keras):
    L = tf_keras.layers
    tf_keras.utils.set_random_seed(0)
    x = inp = L.Input((64, 64, 3), name="input")
    x = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(8, 3, 2, "same", use_bias=False)(x)))
    for t, c, s in ((1, 8, 1), (6, 16, 2), (6, 16, 1), (6, 24, 2)):
        cin = x.shape[-1]
        y = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(cin * t, 1, use_bias=False)(x)))
        y = L.ReLU(6.0)(L.BatchNormalization()(L.DepthwiseConv2D(3, s, "same", use_bias=False)(y)))
        y = L.BatchNormalization()(L.Conv2D(c, 1, use_bias=False)(y))
        x = L.Add()([x, y]) if s == 1 and cin == c else y
    x = L.Dense(10)(L.GlobalAveragePooling2D()(x))
    return tf_keras.Model(inp, x)


def keras_encoder(tf_keras):
    """Embedding + self-attention with a padding mask, dynamic sequence length."""
    import tensorflow as tf

    L = tf_keras.layers
    tf_keras.utils.set_random_seed(0)
    ids = L.Input((None,), dtype="int64", name="input_ids")
    mask = L.Input((None,), dtype="int64", name="attention_mask")
    h = L.Embedding(100, 32)(ids)
    m = tf.cast(mask, tf.bool)
    att = L.MultiHeadAttention(4, 8)(h, h, attention_mask=m[:, None, :] & m[:, :, None])
    h = L.LayerNormalization()(h + att)
    h = L.LayerNormalization()(h + L.Dense(32)(L.Dense(64, activation="relu")(h)))
    w = tf.cast(mask, tf.float32)[:, :, None]
    pooled = tf.reduce_sum(h * w, 1) / tf.maximum(tf.reduce_sum(w, 1), 1.0)
    return tf_keras.Model([ids, mask], L.Dense(5)(pooled))


def keras_lstm(tf_keras):
    L = tf_keras.layers
    tf_keras.utils.set_random_seed(0)
    inp = L.Input((10, 12), name="input")
    return tf_keras.Model(inp, L.Dense(4)(L.LSTM(24)(inp)))
