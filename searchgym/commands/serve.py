"""``searchgym serve``: serve a saved index over HTTP with Search-R1's ``/retrieve`` API."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from searchgym.commands import log_to_stderr

NAME = "serve"
HELP = "serve a saved index over HTTP (Search-R1's /retrieve API), batching concurrent requests"

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _ranged(convert: Callable[[str], Any], low: float, high: float, expected: str) -> Callable[[str], Any]:
    """An argparse ``type`` that reads a number with ``convert`` and keeps it in ``[low, high]``."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _ranged(int, 1, float("inf"), "a positive integer")
_port = _ranged(int, 0, 65535, "a port number in [0, 65535]")
_wait_ms = _ranged(float, 0, 10_000, "milliseconds in [0, 10000]")
_seconds = _ranged(float, 1e-3, 86_400, "seconds in [0.001, 86400]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--index", required=True, help="index directory written by `searchgym index`, or a FAISS index file"
    )
    parser.add_argument(
        "--backend",
        choices=("bm25", "dense"),
        help="index kind (default: bm25 when --index holds a searchgym BM25 index, else dense)",
    )
    parser.add_argument(
        "--corpus",
        help="corpus JSONL of a FAISS index file given as --index (Search-R1's e5_Flat.index + wiki-18.jsonl)",
    )
    parser.add_argument(
        "--model", help="dense only: encoder to use instead of the one recorded with the index"
    )
    parser.add_argument(
        "--query-prefix",
        help="dense only: text put before every query, as the index's passages were encoded (E5: "
        "'query: '; '' for none). Default: the prefix recorded with a searchgym index; a FAISS file records "
        "none, so one whose model expects a prefix (E5, BGE) is refused without this flag",
    )
    parser.add_argument(
        "--index-device",
        default="cpu",
        help="dense only: where the FAISS index is searched: cpu, a GPU id such as 0 (the whole index on that "
        "GPU), or all (sharded over every visible GPU); a GPU needs faiss-gpu. The index's size is printed "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--cache-size",
        type=_ranged(int, 0, float("inf"), "a non-negative integer"),
        default=None,
        help="results kept per (query, topk), least recently used out first, so that repeated searches (a "
        "GRPO group's first ones) are answered without searching; 0 turns the cache off; each --workers "
        "process keeps its own (default: 4096)",
    )
    parser.add_argument(
        "--verify-index",
        action="store_true",
        help="check the SHA-256 digest of every index file on load, however large the index (by default "
        "digests are checked up to 4 GB of index files, sizes always)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default: %(default)s, loopback only)"
    )
    parser.add_argument(
        "--port", type=_port, default=8000, help="TCP port; 0 picks a free one (default: %(default)s)"
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="server processes sharing the port (gunicorn workers), each loading the index; more than one "
        "lets a cheap retriever such as BM25 use more cores (default: %(default)s)",
    )
    parser.add_argument(
        "--replicas",
        type=_positive_int,
        help="serve N replicas with Ray Serve (default: one process, no Ray)",
    )
    parser.add_argument(
        "--cpus-per-replica",
        type=float,
        default=1.0,
        help="with --replicas: CPUs per replica (default: %(default)s)",
    )
    parser.add_argument(
        "--gpus-per-replica",
        type=float,
        default=0.0,
        help="with --replicas: GPUs per replica (default: %(default)s)",
    )
    parser.add_argument(
        "--ray-address", help="Ray cluster to join with --replicas (default: start a local Ray instance)"
    )
    parser.add_argument(
        "--max-batch-size",
        type=_positive_int,
        default=64,
        help="most queries per search call (default: %(default)s)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=_wait_ms,
        default=5.0,
        help="longest a request waits for others to join its batch (default: %(default)s)",
    )
    parser.add_argument(
        "--no-batching", action="store_true", help="search each request alone (for comparison)"
    )
    parser.add_argument(
        "--topk",
        type=_positive_int,
        default=3,
        help="documents per query when a request gives no topk (default: %(default)s)",
    )
    parser.add_argument(
        "--max-queries",
        type=_positive_int,
        default=1024,
        help="cap: queries per request (default: %(default)s)",
    )
    parser.add_argument(
        "--max-query-chars",
        type=_positive_int,
        default=10_000,
        help="cap: characters per query (default: %(default)s)",
    )
    parser.add_argument(
        "--max-topk", type=_positive_int, default=100, help="cap: topk (default: %(default)s)"
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=4 * 1024 * 1024,
        help="cap: request body size in bytes (default: %(default)s)",
    )
    parser.add_argument(
        "--max-results",
        type=_positive_int,
        default=16_384,
        help="cap: queries x topk of one request, which bounds its work (default: %(default)s)",
    )
    parser.add_argument(
        "--max-response-bytes",
        type=_positive_int,
        default=32 * 1024 * 1024,
        help="cap: size of one answer in bytes (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=_positive_int,
        default=1000,
        help="most open client connections; past it the oldest idle one is closed, or the new one "
        "answered 503 (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=60.0,
        help="seconds a connection may stay without sending a whole request head (default: %(default)s)",
    )
    parser.add_argument(
        "--body-timeout",
        type=_seconds,
        default=30.0,
        help="seconds a request body may take to arrive before a 408 (default: %(default)s)",
    )
    parser.add_argument(
        "--send-timeout",
        type=_seconds,
        default=30.0,
        help="seconds a client may take to read an answer before it is dropped and the connection "
        "closed (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.error import SearchGymError
    from searchgym.retrieval.cache import DEFAULT_CACHE_SIZE
    from searchgym.retrieval.faiss_index import check_index_device
    from searchgym.retrieval.server_protocol import RequestLimits

    options: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.verify_index:
        options["verify"] = True
    if args.query_prefix is not None:
        options["query_prefix"] = args.query_prefix
    if args.index_device != "cpu":
        options["index_device"] = check_index_device(args.index_device)
    settings: dict[str, Any] = dict(
        host=args.host,
        port=args.port,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        batching=not args.no_batching,
        default_topk=args.topk,
        limits=RequestLimits(
            max_body_bytes=args.max_body_bytes,
            max_queries=args.max_queries,
            max_query_chars=args.max_query_chars,
            max_topk=args.max_topk,
            max_results=args.max_results,
            max_response_bytes=args.max_response_bytes,
        ),
        idle_timeout_s=args.idle_timeout,
        body_timeout_s=args.body_timeout,
        send_timeout_s=args.send_timeout,
        max_connections=args.max_connections,
        cache_size=DEFAULT_CACHE_SIZE if args.cache_size is None else args.cache_size,
    )
    log_to_stderr("searchgym.retrieval", "searchgym serve: ")  # where the FAISS index goes, and its size
    if args.host not in _LOOPBACK:
        print(
            f"searchgym serve: warning: binding {args.host}: the server has no authentication, so anyone "
            "who can reach this port can query it.",
            file=sys.stderr,
        )
    if args.replicas is not None and args.workers > 1:
        raise SearchGymError("--workers and --replicas do not mix: Ray Serve runs the replicas' processes.")
    if args.replicas is not None:
        from searchgym.trainers.ray_serve import RayServeConfig, serve_with_ray

        ray_config = RayServeConfig(
            index=args.index,
            backend=args.backend,
            corpus_path=args.corpus,
            index_options=options,
            replicas=args.replicas,
            num_cpus_per_replica=args.cpus_per_replica,
            num_gpus_per_replica=args.gpus_per_replica,
            ray_address=args.ray_address,
            **settings,
        )
        serve_with_ray(ray_config, block=True)
        return 0

    try:
        from searchgym.retrieval.server import RetrievalServer
    except ImportError as exc:
        raise SearchGymError(
            f"searchgym serve needs aiohttp, which cannot be imported ({exc}). "
            "Install it with pip install 'searchgym[serve]'."
        ) from exc
    from searchgym.retrieval.service import ServerConfig, listening_message, load_index

    batching = "off" if args.no_batching else f"max {args.max_batch_size} queries / {args.max_wait_ms:g} ms"
    batching += f", cache {args.cache_size} results" if args.cache_size else ", cache off"

    def announce(url: str, backend: str, num_docs: int | None) -> None:
        passages = "passages: unknown" if num_docs is None else f"{num_docs} passages"
        workers = f", {args.workers} workers" if args.workers > 1 else ""
        print(listening_message(url, f"{backend}, {passages}, batching {batching}{workers}"), flush=True)

    if args.workers > 1:
        from searchgym.retrieval.server_workers import serve_workers

        load_options = {**options, "corpus_path": args.corpus} if args.corpus else options
        serve_workers(
            args.index,
            ServerConfig(**settings),
            args.workers,
            backend=args.backend,
            load_options=load_options,
            on_ready=announce,
        )
        return 0
    retriever = load_index(args.index, args.backend, corpus_path=args.corpus, **options)
    server = RetrievalServer(retriever, ServerConfig(**settings))
    server.serve_forever(on_ready=lambda srv: announce(srv.url, srv.backend, srv.service.num_docs()))
    return 0
