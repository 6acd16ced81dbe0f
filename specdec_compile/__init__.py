"""specdec-compile: ONNX graph rewrites for speculative decoding on Cloud AI 100."""

__version__ = "0.1.0"
