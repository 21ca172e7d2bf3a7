"""What runs inside a Spark task: one Beam stage through the SDK's bundle processor.

``bundle_executor`` runs the stage's bundles, ``bundle_splits`` splits a running SDF bundle,
``side_input_state`` serves side inputs, ``user_state`` serves user state through the Fn API
state requests and notes what a task touched, ``staged_state`` reads a subtask's key groups and
stages its changes, ``grouping`` groups shuffled data and owns keys (``partition_for_key``: key
groups, for shuffles and state alike), ``clock`` is the task's processing time (wall or a
TestStream's virtual clock), ``worker_context`` caches what the driver ships per
worker, and ``records`` are what a task hands back to the driver (data, or typed reports told
apart by ``is_report``). Nothing here reads driver memory: everything arrives as bytes with the
task.
"""
