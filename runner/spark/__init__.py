"""The Spark side of a run: the session, its conf and UI names, and what reaches executors.

``session`` finds or builds the session, ``session_conf`` its defaults and log levels,
``labels`` the Spark UI's names, ``shipping`` the user's code, ``filesystem_options`` the
store's credentials into tasks, ``storage_check`` a store executors cannot reach, ``daemon``
the warm Python worker daemon, ``connect_server`` a local Spark Connect server.
"""
