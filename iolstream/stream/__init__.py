"""Stream logic over an explicit state: codec, id memory, alignment, join buffer, micro-batcher, the
processor and its StreamConfig. Imports core only; no Kafka, YAML or Prometheus types.
"""
