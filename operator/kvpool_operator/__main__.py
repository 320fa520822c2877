"""``python -m kvpool_operator``: run the controller (kopf) over every namespace or one.

python -m kvpool_operator [--namespace NS] [--standalone] [--liveness http://0.0.0.0:8081/healthz]
    [--metrics-port 8080] [--metrics-address 0.0.0.0]
"""

from __future__ import annotations

import argparse
import logging

import kopf


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvpool-operator", description="Move GPU memory between colocated models.")
    p.add_argument("--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    p.add_argument("--standalone", action="store_true", help="no peering: only for a single replica")
    p.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0 = off)")
    p.add_argument("--metrics-address", default="0.0.0.0", help="address the metrics port binds (default: all)")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    import kvpool_operator.handlers  # noqa: F401  (registers the handlers)

    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_address)

    kopf.run(
        standalone=args.standalone,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )


if __name__ == "__main__":
    main()
