"""The retrieval server on Ray Serve: N replicas of one index, on one machine or a Ray cluster.

``searchgym serve --index DIR --replicas N`` runs this. It serves the same API as the plain
server (:mod:`searchgym.retrieval.server`): ``POST /retrieve`` in Search-R1's format,
``GET /health`` and ``GET /stats``, with the same request caps and error answers, because
each replica answers through the plain server's
:class:`~searchgym.retrieval.service.RetrievalService` (and so its dynamic batcher). Ray
Serve's HTTP proxy spreads requests over the replicas; each replica batches what it gets.

Ray Serve's HTTP proxy (uvicorn) owns the client connections, so of the plain server's
connection settings only the idle timeout carries over, as the proxy's
``keep_alive_timeout_s`` (whole seconds): it closes a connection idle that long after an
answer, but not one that never sends a whole request, and Ray Serve has no connection cap
(``max_connections`` does not apply). The body timeout, the request caps and slicing apply
in each replica.

Every replica loads the index itself, so on a cluster the directory must
be readable at the same path on every node (a shared file system). ``/stats`` answers with
the counters of whichever replica took the request (its ``replica`` field says which).

Ray is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..checks import check_int, check_number
from ..error import InvalidArgumentError, SearchGymError
from ..retrieval.service import ROUTES, RetrievalService, ServerConfig, listening_message, load_index

__all__ = ["RayServeConfig", "RayServeHandle", "RetrievalReplica", "serve_with_ray"]


@dataclass(frozen=True, kw_only=True)
class RayServeConfig(ServerConfig):
    """Settings of the Ray Serve deployment: the plain server's settings, plus these.

    The :class:`~searchgym.retrieval.service.ServerConfig` fields apply per replica
    (``max_batch_size``, ``max_wait_ms``, ``batching``, ``default_topk``, ``limits``), except
    ``host`` and ``port``, which are those of Ray Serve's HTTP proxy. The fields below are
    keyword-only.

    Attributes:
        index: The saved index every replica loads: a directory, or a FAISS file with ``corpus_path``.
        backend: ``"bm25"``, ``"dense"``, or None to detect it (see ``load_index``).
        corpus_path: Corpus JSONL of a FAISS index file.
        index_options: Options for a non-BM25 backend (e.g. ``{"model": path}``).
        replicas: Number of replicas.
        num_cpus_per_replica: CPUs Ray reserves for each replica.
        num_gpus_per_replica: GPUs Ray reserves for each replica (a dense encoder on GPU).
        ray_address: Cluster to join (``"auto"``, ``"ray://host:10001"``); None starts a
            local Ray instance unless Ray is already initialised.
        app_name: Name of the Serve application.
    """

    index: str
    backend: str | None = None
    corpus_path: str | None = None
    index_options: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    ray_address: str | None = None
    app_name: str = "searchgym-retrieval"

    def __post_init__(self) -> None:
        if not isinstance(self.index, (str, os.PathLike)):
            raise InvalidArgumentError(f"index must be a path, got {self.index!r}.")
        object.__setattr__(self, "index", os.fspath(self.index))
        if not isinstance(self.index_options, dict):
            raise InvalidArgumentError(f"index_options must be a dict, got {self.index_options!r}.")
        check_int("replicas", self.replicas, 1)
        check_number("num_cpus_per_replica", self.num_cpus_per_replica, 0)
        check_number("num_gpus_per_replica", self.num_gpus_per_replica, 0)
        super().__post_init__()  # host, port, batching and caps


def _response(payload: dict[str, Any], status: int = 200) -> Any:
    from starlette.responses import Response

    return Response(content=json.dumps(payload), status_code=status, media_type="application/json")


class RetrievalReplica:
    """One replica: loads the index and answers requests that Ray Serve's proxy hands it.

    Wrapped by :func:`serve_with_ray` with ``ray.serve.deployment``; usable without Ray too,
    since it only needs an object with ``method``, ``url.path``, ``headers`` and ``body()``.
    """

    def __init__(self, config: RayServeConfig) -> None:
        self.config = config
        retriever = load_index(
            config.index, config.backend, corpus_path=config.corpus_path, **config.index_options
        )
        self.service = RetrievalService(retriever, config)
        """The plain server's answers and counters (its batcher starts at the first request)."""
        self.replica = f"{os.uname().nodename}:{os.getpid()}"

    async def __call__(self, request: Any) -> Any:
        try:
            return await self._route(request)
        except Exception as exc:  # a replica never dies on a request
            return _response(self.service.internal_error(exc, request.method, request.url.path), 500)

    async def _route(self, request: Any) -> Any:
        path = request.url.path.rstrip("/") or "/"
        if ROUTES.get(path) != request.method:
            status, reason = (405, "Method Not Allowed") if path in ROUTES else (404, "Not Found")
            return _response(self.service.refuse(status, reason, request.method, path), status)
        if path == "/retrieve":
            length = request.headers.get("content-length")
            status, payload = await self.service.retrieve(
                int(length) if length is not None and length.isdigit() else None, request.body
            )
            return _response(payload, status)
        payload = self.service.health_payload() if path == "/health" else self.service.stats_payload()
        return _response({**payload, "replica": self.replica})


@dataclass
class RayServeHandle:
    """A running deployment: its URL, and how to stop it."""

    url: str
    app_name: str

    def shutdown(self) -> None:
        """Delete the application and stop Ray Serve (Ray itself keeps running)."""
        from ray import serve

        serve.delete(self.app_name)
        serve.shutdown()


def serve_with_ray(config: RayServeConfig, *, block: bool = False) -> RayServeHandle:
    """Deploy :class:`RetrievalReplica` on Ray Serve and wait until it answers.

    Args:
        config: The deployment settings.
        block: Serve until Ctrl-C (then shut Serve down); otherwise return at once.

    Returns:
        The URL of the deployment and a way to shut it down.

    Raises:
        SearchGymError: Ray Serve is not installed (``pip install 'ray[serve]'``).
    """
    if not isinstance(config, RayServeConfig):
        raise InvalidArgumentError(f"config must be a RayServeConfig, got {type(config).__name__}.")
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise SearchGymError(
            f"--replicas needs Ray Serve, which cannot be imported ({exc}). Install it with "
            "pip install 'searchgym[serve]' (or pip install 'ray[serve]'), or leave out --replicas."
        ) from exc
    # Fail here, with a clear message, rather than in N replicas.
    load_index(config.index, config.backend, corpus_path=config.corpus_path, **config.index_options)
    if not ray.is_initialized():
        ray.init(address=config.ray_address, include_dashboard=False, log_to_driver=False)
    http_options = {
        "host": config.host,
        "port": config.port,
        "keep_alive_timeout_s": max(1, math.ceil(config.idle_timeout_s)),  # uvicorn's idle timeout
    }
    serve.start(http_options=http_options)
    actor_options: dict[str, Any] = {"num_cpus": config.num_cpus_per_replica}
    if config.num_gpus_per_replica:
        actor_options["num_gpus"] = config.num_gpus_per_replica
    deployment: Any = serve.deployment(
        RetrievalReplica,
        name="retrieval",
        num_replicas=config.replicas,
        ray_actor_options=actor_options,
        max_ongoing_requests=max(256, 4 * config.max_batch_size),
    )
    serve.run(deployment.bind(config), name=config.app_name, route_prefix="/")
    handle = RayServeHandle(url=config.url_at(config.port), app_name=config.app_name)
    if block:
        print(
            listening_message(handle.url, f"Ray Serve, {config.replicas} replica(s) of {config.index}"),
            flush=True,
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            handle.shutdown()
    return handle
