"""The CPU offload tier inside vLLM: ``offloading`` drives vLLM's OffloadingConnector for the pool
(fences, accounts), ``worker`` supplies its spec and the whole-block transfers."""
