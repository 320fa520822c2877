"""Starting engines and servers: vLLM flags and engine kwargs (``args``), a synchronous engine
facade (``runner``), vLLM's OpenAI-app builders for ``kvpool_server`` (``openai``) and the
models the tests and ``make serve`` use (``tiny_model``, ``smollm2``)."""
