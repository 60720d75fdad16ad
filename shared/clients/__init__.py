"""Small httpx clients (sync and async) for the services, speaking the models in `shared.contracts`."""

from shared.clients.base import ServiceError
from shared.clients.evaluator import AsyncEvaluatorClient, EvaluatorClient
from shared.clients.implementer import AsyncImplementerClient, ImplementerClient

__all__ = ["AsyncEvaluatorClient", "AsyncImplementerClient", "EvaluatorClient", "ImplementerClient", "ServiceError"]
