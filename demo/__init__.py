"""The end-to-end demo, run as ``python -m demo.run_demo`` (``make demo``, ``make demo-toy``).

Entry points: ``run_demo`` (the command line), ``train_pair`` (the toy pair),
``smollm2`` (the real target), ``distill`` (its draft); each runs with ``python -m demo.<name>``.
The real model's path is ``real_demo``, the toy pair's ``toy_demo``. Shared by both and by
bench/: ``compiling`` (specdec-compile, cached; the dlm/tlm/tlm-base trio), ``cache``
(stamped, keyed stage directories), ``rates`` (the decode rate), ``stream`` (printing a
generation as it streams), ``progress`` (progress bars).
"""
