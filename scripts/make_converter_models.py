"""Int8 .tflite files written by TensorFlow's own converter (full-integer quantization, int8 input
and output) of tf_keras models with random weights: the files benchmarks/tflite_int8_import.py
imports and checks against LiteRT. TensorFlow is not one of npuforge's dependencies; in a venv of
its own (see scripts/make_int8_lstm_fixtures.py):

    /tmp/tf-venv/bin/python scripts/make_converter_models.py OUT_DIR [NAME ...]

Each model is calibrated on 16 seeded inputs (images uniform in [-1, 1], sequences likewise). The
classifiers end at their logits (classifier_activation=None): with random weights the logits
are near-constant, and a SOFTMAX on them gets an input scale below the 2^-26 LiteRT's reference
kernel takes.
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

K = tf.keras
L = K.layers
A = K.applications


def _seq(shape, *layers):
    inp = K.Input(shape=shape, batch_size=1)
    x = inp
    for layer in layers:
        x = layer(x)
    return K.Model(inp, x)


def _attention(norm: bool):
    inp = K.Input(shape=(16, 32), batch_size=1)
    x = L.MultiHeadAttention(num_heads=4, key_dim=8)(inp, inp) + inp
    x = L.LayerNormalization()(x) if norm else x
    return K.Model(inp, L.Dense(10)(L.GlobalAveragePooling1D()(x)))


def _app(cls, size: int, **kw):
    return lambda: cls(weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None, **kw)


RAW = dict(include_preprocessing=False)  # the models that have it: the input as it is, as the others
MODELS = {
    "mobilenet_v2_035_96": _app(A.MobileNetV2, 96, alpha=0.35),
    "mobilenet_v3_small_96": _app(A.MobileNetV3Small, 96, **RAW),
    "mobilenet_v3_large_96": _app(A.MobileNetV3Large, 96, **RAW),
    "efficientnet_b0_96": _app(A.EfficientNetB0, 96),
    "efficientnet_v2_b0_96": _app(A.EfficientNetV2B0, 96, **RAW),
    "resnet50_64": _app(A.ResNet50, 64),
    "densenet121_64": _app(A.DenseNet121, 64),
    "nasnet_mobile_96": _app(A.NASNetMobile, 96),
    "xception_96": _app(A.Xception, 96),
    "inception_v3_96": _app(A.InceptionV3, 96),
    "convnext_tiny_64": _app(A.ConvNeXtTiny, 64, **RAW),
    "regnetx_002_64": _app(A.RegNetX002, 64, **RAW),
    "vgg16_64": _app(A.VGG16, 64),
    "conv1d_audio": lambda: _seq((128, 8), L.Conv1D(16, 5, activation="relu"), L.MaxPooling1D(2),
                                 L.Conv1D(32, 3, padding="same"), L.GlobalAveragePooling1D(), L.Dense(4)),
    "gru": lambda: _seq((12, 6), L.GRU(16, return_sequences=True), L.Dense(3)),
    "attention": lambda: _attention(False),
    "attention_layernorm": lambda: _attention(True),
    "unet_like": lambda: _unet(),  # (defined below)
    "activations": lambda: _seq((8, 8, 4), L.Conv2D(8, 3, padding="same"), L.LeakyReLU(0.2), L.Conv2D(8, 1),
                                L.PReLU(shared_axes=[1, 2]), L.Conv2D(8, 1, activation="swish"),
                                L.Conv2D(8, 1, activation="hard_sigmoid"), L.Conv2D(4, 1, activation="tanh")),
    "pools_and_pads": lambda: _seq((16, 16, 3), L.ZeroPadding2D(1), L.Conv2D(8, 3), L.Cropping2D(((1, 0), (0, 1))),
                                   L.MaxPooling2D(2), L.UpSampling2D(), L.GlobalMaxPooling2D(), L.Dense(4)),
    "merge_layers": lambda: _merge(),
    "conv_variants": lambda: _seq((12, 12, 4), L.Conv2D(8, 3, groups=2, padding="same"),
                                  L.Conv2D(8, 3, dilation_rate=2, padding="same"),
                                  L.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
                                  L.SeparableConv2D(6, 3, strides=2, padding="same", depth_multiplier=2),
                                  L.Conv2D(4, 3, strides=2, padding="valid"), L.Flatten(), L.Dense(3)),
    "math_ops": lambda: _seq((6, 10), L.Dense(10), L.Lambda(lambda x: tf.abs(x) + tf.square(x)),
                             L.Lambda(lambda x: tf.sqrt(x + 1.0) * tf.exp(-x)), L.Softmax(axis=1),
                             L.Lambda(lambda x: tf.reduce_sum(x, axis=-1, keepdims=True) + x), L.Dense(4)),
    "norms": lambda: _seq((8, 8, 8), L.Conv2D(8, 1), L.BatchNormalization(), L.Activation("relu"),
                          L.GroupNormalization(groups=2), L.Conv2D(4, 1)),
    "resizes": lambda: _seq((6, 6, 4), L.UpSampling2D(interpolation="nearest"), L.Resizing(9, 9),
                            L.Resizing(5, 7, interpolation="nearest"), L.Conv2D(4, 1)),
    "embedding": lambda: _embedding(),
}


def _merge():
    inp = K.Input(shape=(8, 8, 3), batch_size=1)
    a = L.Conv2D(6, 1)(inp)
    b = L.Conv2D(6, 3, padding="same")(inp)
    x = L.Concatenate()([L.Maximum()([a, b]), L.Minimum()([a, b]), L.Average()([a, b]), L.Subtract()([a, b])])
    x = L.Permute((3, 1, 2))(x)
    return K.Model(inp, L.Dense(5)(L.Flatten()(x)))


def _embedding():
    inp = K.Input(shape=(10,), batch_size=1, dtype="int32")
    x = L.Embedding(50, 16)(inp)
    return K.Model(inp, L.Dense(4)(L.GlobalAveragePooling1D()(x)))


def _unet():
    inp = K.Input(shape=(32, 32, 3), batch_size=1)
    a = L.Conv2D(8, 3, padding="same", activation="relu")(inp)
    b = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(a)
    c = L.Conv2DTranspose(8, 3, strides=2, padding="same")(b)
    d = L.Concatenate()([a, c])
    e = L.UpSampling2D(interpolation="bilinear")(L.SeparableConv2D(8, 3, padding="same")(d))
    return K.Model(inp, L.Conv2D(2, 1, activation="sigmoid")(e))


def convert(model) -> bytes:
    shape = [1] + list(model.input_shape[1:])
    ids = model.inputs[0].dtype == tf.int32  # token ids: calibrated on ids, left int32 by the converter
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)

    def representative():
        for _ in range(16):
            yield [rng.integers(0, 50, shape).astype(np.int32) if ids else rng.uniform(-1, 1, shape).astype(np.float32)]

    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if not ids:  # (the converter keeps an int32 input as it is)
        conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


def main(out: str, names: list) -> None:
    os.makedirs(out, exist_ok=True)
    for name in names or MODELS:
        t = time.perf_counter()
        try:
            tf.random.set_seed(0)
            data = convert(MODELS[name]())
        except Exception as e:  # the converter's own failure: reported, the next model goes on
            print(f"{name}: converter failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            continue
        with open(os.path.join(out, f"{name}.tflite"), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes, {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
