"""What runs inside a Spark task: one Beam stage through the SDK's bundle processor, its
side inputs, user and keyed state, shuffles, and the records it hands back to the driver.
Nothing here reads driver memory: everything arrives as bytes with the task.
"""
