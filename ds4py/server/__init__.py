"""ds4py-server: an OpenAI-compatible HTTP server (FastAPI + uvicorn).

Layout: ``main`` (options, uvicorn), ``app`` (state, middleware, small
endpoints), ``openai_api`` / ``anthropic_api`` (generation endpoints),
``convert`` (request -> JobSpec), ``jobs`` (asyncio <-> scheduler bridge),
``scheduler`` (slots, queue, the stepping thread), ``engine`` (one job's
steps), ``grammar`` (llguidance masks), ``metrics``, ``sse``.
"""

from .app import ServerConfig, create_app
from .main import main

__all__ = ["ServerConfig", "create_app", "main"]
