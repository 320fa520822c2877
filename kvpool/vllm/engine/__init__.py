"""Code that runs inside vLLM's processes: the KV connector (``connector``) and its two halves --
``scheduler_side`` in the engine core, ``worker_side`` in each worker rank -- with the messages
between them (``protocol``), the geometry read from vLLM's ``KVCacheConfig`` and the connector's
JSON settings."""
