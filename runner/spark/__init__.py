"""The Spark side of a run: the session, its conf and UI names, and what reaches executors.

``session`` finds or builds the SparkSession (spark-submit's, a live one, or from the options),
``session_conf`` its defaults and log levels, ``labels`` the names in the Spark UI, ``shipping``
the user's code to executors, ``filesystem_options`` the store's credentials into every task,
``storage_check`` a store executors cannot reach, ``daemon`` the warm Python worker daemon,
``connect_server`` a local Spark Connect server (``sparkbeam serve``, ``--spark_remote``).
"""
