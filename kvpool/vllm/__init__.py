"""The only package that imports vLLM: the KV connector that puts vLLM's KV cache in a kvpool.

Import the submodules you need (``kvpool.vllm.launch.args``, ``kvpool.vllm.engine.connector``, ...); this
package imports nothing eagerly because ``import vllm`` takes seconds.
"""
