"""Int8 LSTM .tflite files from TensorFlow's own converter (full-integer quantization of tf_keras
LSTMs with random weights, 64 calibration inputs uniform in [-r, r]): the fixtures in
tests/data/tflite_lstm_int8 that tests/test_tflite_lstm_int8.py checks against LiteRT.

TensorFlow is not one of npuforge's dependencies; in a venv of its own:

    python3 -m venv /tmp/tf-venv && /tmp/tf-venv/bin/pip install tensorflow-cpu "tf_keras~=2.21.0"
    /tmp/tf-venv/bin/python scripts/make_int8_lstm_fixtures.py tests/data/tflite_lstm_int8

(written with tensorflow-cpu 2.21.0 and tf_keras 2.21; the legacy Keras is what fuses an LSTM
into UNIDIRECTIONAL_SEQUENCE_LSTM: Keras 3's LSTM crashed the converter)."""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf
out = sys.argv[1]
def build(name, layers, steps, feat, batch, seed, input_range=1.0):
    tf.random.set_seed(seed)
    inp = tf.keras.Input(shape=(steps, feat), batch_size=batch)
    x = inp
    for layer in layers:
        x = layer(x)
    model = tf.keras.Model(inp, x)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(seed)
    def rep():
        for _ in range(64):
            yield [rng.uniform(-input_range, input_range, (batch, steps, feat)).astype(np.float32)]
    conv.representative_dataset = rep
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    data = conv.convert()
    open(os.path.join(out, name + ".tflite"), "wb").write(data)
    print("wrote", name, len(data))
L = tf.keras.layers
build("lstm_8", [L.LSTM(8, return_sequences=True)], 6, 5, 1, 0)
build("lstm_16_20_steps", [L.LSTM(16, return_sequences=True)], 20, 3, 1, 1)
build("lstm_stack", [L.LSTM(8, return_sequences=True), L.LSTM(8, return_sequences=True)], 6, 5, 1, 2)
build("dense_lstm_dense_batch2", [L.Dense(12, activation="relu"), L.LSTM(8, return_sequences=True), L.Dense(3)], 6, 5, 2, 3)
build("lstm_last_step", [L.LSTM(12), L.Dense(4)], 10, 6, 1, 4)
build("lstm_wide_input", [L.LSTM(24, return_sequences=True)], 8, 10, 1, 5, input_range=4.0)
