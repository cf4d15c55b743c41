"""Exported models run from Python, called like the PyTorch ones: an ONNX
model in onnxruntime (:class:`OnnxModel`)."""

import torch


class OnnxModel:
    """An ONNX model in onnxruntime (CPU), called like the PyTorch one.

    Args:
        path (str): the ``.onnx`` file.
        threads (int, optional): onnxruntime's intra-op threads; default:
            torch's thread count.

    Example:
        >>> outputs = OnnxModel('model.onnx')(torch.randn(1, 3, 64, 64))
    """

    def __init__(self, path, threads=None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            path, options, providers=['CPUExecutionProvider']
        )
        self.input_name = self.session.get_inputs()[0].name
        #: how many tensors a call returns
        self.num_outputs = len(self.session.get_outputs())

    def __call__(self, x):
        """Tuple of output tensors for the input ``x`` (a tensor)."""
        outs = self.session.run(
            None, {self.input_name: x.detach().cpu().numpy()}
        )
        return tuple(torch.from_numpy(o) for o in outs)
