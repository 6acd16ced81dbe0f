"""The OpenVINO backend (optional: ``pip install 'specdec-compile[openvino]'``): ``loader`` reads,
checks and makes the cache state variables (MakeStateful), ``runner`` runs it. Importing this
package needs no OpenVINO; loading a model without it is a one-line error."""
from .loader import INSTALL_HINT, OpenVinoModel, import_openvino, load_openvino
from .runner import OpenVinoBackend

__all__ = ["INSTALL_HINT", "OpenVinoBackend", "OpenVinoModel", "import_openvino", "load_openvino"]
