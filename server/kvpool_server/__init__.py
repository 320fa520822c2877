"""kvpool-server: one model over the OpenAI HTTP API (vLLM's own app, in-process), its KV cache
in a kvpool, plus the pool's admin API (``/kvpool``), memory metrics and health probes."""
