"""A .tflite model in MediaPipe's own runtime, custom ops included: the reference for MediaPipe's
attention-mesh ops (Landmarks2TransformMatrix, TransformTensorBilinear, TransformLandmarks), which
LiteRT has no kernels for. Run it with a Python that imports mediapipe (0.10.14 was used):

    PY benchmarks/mediapipe_runtime.py MODEL.tflite N_OUTPUTS OUT.npz < IMAGES.npy

IMAGES.npy: uint8 [N, H, W, 3] RGB images of the model's input size. Each goes through MediaPipe's
ImageToTensorCalculator (the whole image, values mapped to [0, 1]) and its InferenceCalculator with
the TfLiteCustomOpResolverCalculator's resolver (the TFLite CPU kernels and MediaPipe's custom
ops). OUT.npz: ``input`` (the float tensors the model got, [N, H * W * 3]) and ``output0``,
``output1``, ... (each output flattened, [N, size]), in the file's output order.
``run_mediapipe`` does the same from another Python, through a subprocess.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def run_mediapipe(python: str, model: Path, outputs: int, images: np.ndarray) -> dict:
    """``images`` (uint8 [N, H, W, 3]) through ``model`` (``outputs`` outputs) in MediaPipe's runtime,
    in the Python ``python``: -> the arrays of OUT.npz above."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(images, np.uint8))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npz"
        done = subprocess.run([python, __file__, str(model), str(outputs), str(out)], input=buf.getvalue(),
                              capture_output=True)
        if done.returncode:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise RuntimeError(f"MediaPipe's runtime failed on {Path(model).name}: {tail[0]}")
        with np.load(out) as z:
            return {k: z[k] for k in z.files}


def graph_config(model: str, outputs: int, height: int, width: int) -> str:
    """The calculator graph: image -> tensor in [0, 1] -> the model -> each output as floats."""
    split = "".join(f'output_stream: "o{i}" ' for i in range(outputs))
    ranges = "".join(f"ranges {{ begin: {i} end: {i + 1} }} " for i in range(outputs))
    floats = "".join(f'node {{ calculator: "TensorsToFloatsCalculator" input_stream: "TENSORS:o{i}" '
                     f'output_stream: "FLOATS:f{i}" }}\n' for i in range(outputs))
    return f"""input_stream: "image"
node {{ calculator: "ImageToTensorCalculator" input_stream: "IMAGE:image" output_stream: "TENSORS:t"
  options {{ [mediapipe.ImageToTensorCalculatorOptions.ext] {{ output_tensor_width: {width}
    output_tensor_height: {height} output_tensor_float_range {{ min: 0.0 max: 1.0 }} }} }} }}
node {{ calculator: "TfLiteCustomOpResolverCalculator" output_side_packet: "OP_RESOLVER:op_resolver" }}
node {{ calculator: "InferenceCalculator" input_stream: "TENSORS:t" input_side_packet: "OP_RESOLVER:op_resolver"
  output_stream: "TENSORS:o" options {{ [mediapipe.InferenceCalculatorOptions.ext] {{ model_path: "{model}"
  delegate {{ tflite {{}} }} }} }} }}
node {{ calculator: "SplitTensorVectorCalculator" input_stream: "o" {split}
  options {{ [mediapipe.SplitVectorCalculatorOptions.ext] {{ {ranges} }} }} }}
node {{ calculator: "TensorsToFloatsCalculator" input_stream: "TENSORS:t" output_stream: "FLOATS:fin" }}
{floats}"""


def main() -> None:
    import mediapipe as mp
    from google.protobuf import text_format
    from mediapipe.framework import calculator_pb2

    model, outputs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    images = np.load(io.BytesIO(sys.stdin.buffer.read()))
    _, h, w, _ = images.shape
    config = text_format.Parse(graph_config(model, outputs, h, w), calculator_pb2.CalculatorGraphConfig())
    graph = mp.CalculatorGraph(graph_config=config)
    got: dict = {}
    for stream in [f"f{i}" for i in range(outputs)] + ["fin"]:
        graph.observe_output_stream(stream, lambda name, packet: got.setdefault(name, []).append(
            np.array(mp.packet_getter.get_float_list(packet), np.float32)))
    graph.start_run()
    for k, img in enumerate(images):
        frame = mp.ImageFrame(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(img))
        graph.add_packet_to_input_stream("image", mp.packet_creator.create_image_frame(frame).at(k))
    graph.close()
    np.savez(out, input=np.stack(got["fin"]), **{f"output{i}": np.stack(got[f"f{i}"]) for i in range(outputs)})


if __name__ == "__main__":
    main()
