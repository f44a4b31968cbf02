"""Log shipping: the ECS log files every process writes, sent to Elasticsearch (``log_shipper``, `pretrain
ship-logs` or in-process) with the index template, ILM policy and data stream they go into (``es_index``)."""
