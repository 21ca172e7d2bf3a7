"""``--streaming`` runs: every independent pipeline in rounds, each round one checkpoint.

``job`` starts a run and returns its live result, ``executor`` runs each pipeline's loop on its
own thread, ``loop`` restores, runs and commits one pipeline's rounds, ``round`` builds one round
as one Spark job, ``group`` and ``stateful`` keep GroupByKey and user state across rounds
(``trigger_codec`` writes trigger state without pickle), ``pushback`` holds main inputs until
side inputs are ready, ``watermarks`` fixes each round's watermarks. Its flags are
``sparkbeam.runner.options.SparkStreamingOptions``.
"""
