"""The Cloud AI 100 backend: ``loader`` finds, checks and loads the QPC, ``runner`` runs it."""
from .loader import QaicProgram, find_qpc, import_qaicrt, load_qaic
from .runner import QaicBackend

__all__ = ["QaicBackend", "QaicProgram", "find_qpc", "import_qaicrt", "load_qaic"]
