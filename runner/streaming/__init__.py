"""``--streaming`` runs: every independent pipeline in rounds, each round one checkpoint.

``job`` starts a run and returns its live result, ``executor`` runs each pipeline's round loop
(``rounds.loop.RoundLoop``) on its own thread and owns signals and the drain request,
``pipeline`` is a pipeline's part of a round (``PipelineRounds``: restore, live stages,
metadata), ``round`` builds one round as one Spark job, ``group`` and ``stateful`` keep
GroupByKey and user state across rounds (``trigger_codec`` writes trigger state without
pickle), ``pushback`` holds main inputs until side inputs are ready, ``watermarks`` fixes each
round's watermarks. Its flags are ``sparkbeam.runner.options.SparkStreamingOptions``.
"""
