"""The thin runtime: run a DLM/TLM pair of artifact directories.

    from specdec_compile.runtime import OrtBackend, SpecDecoder, SamplingParams
    tlm = OrtBackend("OUT_TLM"); dlm = OrtBackend("OUT_DLM")
    res = SpecDecoder(tlm, dlm, eos_token_id=2).generate([1, 5, 7], max_new_tokens=32)
    res.generated_ids, res.metrics
    SpecDecoder(tlm, draft=NgramDraft()).generate_many(prompts)    # n-gram drafts, every row
    dec = SpecDecoder(tlm, dlm, tokenizer="TOKDIR")                 # HF-style arguments (hf_args.py):
    dec.generate("Hello", max_new_tokens=32, do_sample=True, seed=0).text
    for text in dec.stream(messages=[{"role": "user", "content": "Hi"}]): ...

See docs/runtime.md and docs/serving.md.
"""
from ..artifact.reader import Artifact, load_artifact
from .pairing import check_pair
from .backends import Backend, OpenVinoBackend, OrtBackend, QaicBackend, open_backend
from .decoding import SpecDecoder, TargetOnlyDecoder, generate
from .drafts import DraftContext, TargetStep
from .drafts.dlm import DlmDraft
from .drafts.feature import FeatureDraft
from .drafts.hybrid import HybridDraft
from .drafts.ngram import NgramDraft
from .drafts.suffix import SuffixDraft
from .metrics import GenerationResult, aggregate_metrics
from .policy import WidthPolicy
from .sampling import SamplingParams
from .vocab import PairVocab

__all__ = ["Artifact", "Backend", "DlmDraft", "DraftContext", "FeatureDraft", "GenerationResult", "HybridDraft", "NgramDraft", "TargetStep",
           "WidthPolicy", "OpenVinoBackend", "OrtBackend", "PairVocab", "QaicBackend", "SamplingParams",
           "SpecDecoder", "SuffixDraft", "TargetOnlyDecoder", "aggregate_metrics", "check_pair", "generate",
           "load_artifact", "open_backend"]
