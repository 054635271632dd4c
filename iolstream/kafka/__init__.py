"""The Kafka adapter: the worker loop and the collaborators that hold its clients (offsets, transactions,
checkpoints, client calls, topics), the snapshot store and the YAML config loader.
"""
