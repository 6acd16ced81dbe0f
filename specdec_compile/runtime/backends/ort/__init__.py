"""The ONNX Runtime backend: ``loader`` opens and checks a graph, ``runner`` binds and runs it."""
from .loader import OrtModel, create_session, load_ort
from .runner import OrtBackend

__all__ = ["OrtBackend", "OrtModel", "create_session", "load_ort"]
