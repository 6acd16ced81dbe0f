"""The end-to-end demo, run as ``python -m demo.run_demo`` (``make demo``, ``make demo-toy``).

Entry point: ``run_demo`` (the command line). The real model's path is ``real_demo``, the toy
pair's ``toy_demo``; the models themselves come from workshop/ (converted, distilled, trained
there). Shared by both and by bench/: ``compiling`` (specdec-compile, cached; the dlm/tlm/tlm-base
trio), ``rates`` (the decode rate), ``stream`` (printing a generation as it streams), ``ngram``
(prompt lookup replayed on the target's answers).
"""
