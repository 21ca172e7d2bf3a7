"""``--streaming`` runs: every independent pipeline in rounds, each round one checkpoint.

``job`` starts a run, ``executor`` runs each pipeline's ``rounds.loop.RoundLoop`` on its own
thread, ``pipeline`` is a pipeline's part of a round, ``round`` builds it as one Spark job;
``group`` (``on_time_panes``, ``trigger_codec``) and ``stateful`` keep GroupByKey and user
state, ``side_input_store`` and ``pushback`` side inputs, ``watermarks`` fixes each round's
watermarks, ``test_stream`` plays a TestStream. Flags: ``runner.options.SparkStreamingOptions``.
"""
