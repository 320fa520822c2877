"""kvpool-router: one OpenAI endpoint for a group of colocated model servers.

    python -m kvpool_server.router --upstream llama=http://127.0.0.1:8001 --upstream qwen=http://127.0.0.1:8002

``GET /v1/models`` lists every model of the group; every other OpenAI route goes to the server
named by the body's ``model``, streamed through unbuffered (aiohttp's client underneath,
Starlette's streaming response above; nothing parses HTTP by hand). It imports neither vLLM nor torch, so
it starts in a second and runs in a container of its own.
"""
