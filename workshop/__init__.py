"""The model workshop: the models the demo and the benchmarks decode, converted, distilled and
trained here (python -m workshop.<name>; the demo runs every stage it needs, cached).

``smollm2`` (the real target: wheel, GGUF to float32, export), ``distill`` (its distilled draft;
``teacher`` the batched teacher that writes the training answers, ``draft_head`` the cut LM head),
``feature_draft`` (the EAGLE-style feature draft: head, data, export; ``feature_train`` its
training, ``feature_eval`` its held-out evaluation and loop replay), ``train_pair`` (the toy pair
trained from scratch; ``labels`` the TLM's labels its DLM is distilled on), ``prompts`` (the
instructions the drafts learn from, and the demo's held-out ones they never see), ``cache``
(stamped, keyed stage directories, all-or-nothing publish, optimum export) and ``progress``
(progress bars). The workshop never imports demo/ or bench/.
"""
