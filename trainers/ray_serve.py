"""The retrieval server on Ray Serve: N replicas of one index, on one machine or a Ray cluster.

``searchgym serve --index DIR --replicas N`` runs this. It serves the same API as the plain
server (:mod:`searchgym.envs.retrieval.server`): ``POST /retrieve`` in Search-R1's format,
``GET /health`` and ``GET /stats``, with the same request caps and error answers, because
each replica reuses the plain server's request parsing and :class:`DynamicBatcher`. Ray
Serve's HTTP proxy spreads requests over the replicas; each replica batches what it gets.

Every replica loads the index itself, so on a cluster the directory must
be readable at the same path on every node (a shared file system). ``/stats`` answers with
the counters of whichever replica took the request (its ``replica`` field says which).

Ray is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..envs.errors import InvalidArgumentError, SearchGymError
from ..envs.retrieval.server import DynamicBatcher, ServerConfig, ServerStats, load_index
from ..envs.retrieval.server_protocol import (
    RequestError,
    RequestLimits,
    check_body_size,
    error_payload,
    format_response,
    parse_retrieve_request,
)

__all__ = ["RayServeConfig", "RayServeHandle", "RetrievalReplica", "serve_with_ray"]


@dataclass(frozen=True)
class RayServeConfig:
    """Settings of the Ray Serve deployment.

    Attributes:
        index: The saved index every replica loads: a directory, or a FAISS file with ``corpus_path``.
        backend: ``"bm25"``, ``"dense"``, or None to detect it (see ``load_index``).
        corpus_path: Corpus JSONL of a FAISS index file.
        index_options: Options for a non-BM25 backend (e.g. ``{"model": path}``).
        replicas: Number of replicas.
        num_cpus_per_replica: CPUs Ray reserves for each replica.
        num_gpus_per_replica: GPUs Ray reserves for each replica (a dense encoder on GPU).
        host: Interface of Ray Serve's HTTP proxy; loopback unless told otherwise.
        port: Port of the HTTP proxy.
        max_batch_size: Most queries per search call, per replica.
        max_wait_ms: Longest a request waits for its batch to fill, per replica.
        batching: False searches each request alone.
        default_topk: ``topk`` of a request that gives none.
        limits: Caps on one request.
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
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int = 64
    max_wait_ms: float = 5.0
    batching: bool = True
    default_topk: int = 3
    limits: RequestLimits = field(default_factory=RequestLimits)
    ray_address: str | None = None
    app_name: str = "searchgym-retrieval"

    def __post_init__(self) -> None:
        if not isinstance(self.index, (str, os.PathLike)):
            raise InvalidArgumentError(f"index must be a path, got {self.index!r}.")
        object.__setattr__(self, "index", os.fspath(self.index))
        if not isinstance(self.index_options, dict):
            raise InvalidArgumentError(f"index_options must be a dict, got {self.index_options!r}.")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise InvalidArgumentError(f"replicas must be an int >= 1, got {self.replicas!r}.")
        for name in ("num_cpus_per_replica", "num_gpus_per_replica"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(f"{name} must be a number >= 0, got {value!r}.")
        self.server_config()  # validates host, port, batching and caps

    def server_config(self) -> ServerConfig:
        """The plain server's settings that each replica applies."""
        return ServerConfig(
            host=self.host,
            port=self.port,
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            batching=self.batching,
            default_topk=self.default_topk,
            limits=self.limits,
        )


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
        self.server_config = config.server_config()
        self.retriever = load_index(
            config.index, config.backend, corpus_path=config.corpus_path, **config.index_options
        )
        self.backend = self.retriever.name or type(self.retriever).__name__
        self.stats = ServerStats()
        self.replica = f"{os.uname().nodename}:{os.getpid()}"
        self._batcher: DynamicBatcher | None = None

    def _get_batcher(self) -> DynamicBatcher:
        if self._batcher is None:  # created on the replica's event loop, at the first request
            config = self.server_config
            self._batcher = DynamicBatcher(
                self.retriever.search,
                max_batch_size=config.max_batch_size,
                max_wait_s=config.max_wait_ms / 1000,
                batching=config.batching,
                stats=self.stats,
            )
        return self._batcher

    async def __call__(self, request: Any) -> Any:
        try:
            return await self._route(request)
        except Exception as exc:  # a replica never dies on a request
            self.stats.errors[500] += 1
            return _response(error_payload(f"Internal server error: {exc!r}"), 500)

    async def _route(self, request: Any) -> Any:
        path = request.url.path.rstrip("/") or "/"
        routes = {"/retrieve": "POST", "/health": "GET", "/stats": "GET"}
        if path not in routes or request.method != routes[path]:
            status = 405 if path in routes else 404
            self.stats.errors[status] += 1
            return _response(
                error_payload(
                    f"{'Method Not Allowed' if status == 405 else 'Not Found'} ({request.method} {path}). "
                    "This server answers POST /retrieve, GET /health and GET /stats."
                ),
                status,
            )
        if path == "/health":
            try:
                num_docs: int | None = len(self.retriever)
            except Exception:  # len() is optional for a Retriever
                num_docs = None
            return _response(
                {"status": "ok", "backend": self.backend, "num_docs": num_docs, "replica": self.replica}
            )
        if path == "/stats":
            config = self.server_config
            return _response(
                {
                    **self.stats.to_dict(),
                    "batching": config.batching,
                    "max_batch_size": config.max_batch_size,
                    "max_wait_ms": config.max_wait_ms,
                    "replica": self.replica,
                }
            )
        return await self._retrieve(request)

    async def _retrieve(self, request: Any) -> Any:
        self.stats.requests += 1
        limits = self.server_config.limits
        try:
            length = request.headers.get("content-length")
            check_body_size(int(length) if length is not None and length.isdigit() else None, limits)
            body = await request.body()
            parsed = parse_retrieve_request(body, limits, self.server_config.default_topk)
        except RequestError as exc:
            self.stats.errors[exc.status] += 1
            return _response(exc.payload, exc.status)
        try:
            results = await self._get_batcher().submit(parsed.queries, parsed.topk)
        except Exception as exc:  # the retriever failed: answer 500 and keep serving
            self.stats.errors[500] += 1
            return _response(error_payload(f"The retriever failed: {exc}"), 500)
        return _response(format_response(results, parsed.return_scores))


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
    serve.start(http_options={"host": config.host, "port": config.port})
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
    host = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
    handle = RayServeHandle(url=f"http://{host}:{config.port}", app_name=config.app_name)
    if block:
        print(
            f"searchgym serve: listening on {handle.url} (Ray Serve, {config.replicas} replica(s) of "
            f"{config.index}); POST /retrieve, GET /health, GET /stats. Ctrl-C stops.",
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
