"""``python -m deployments.edge.keys new``: a new API key and the digest that goes in the configuration.

``python -m deployments.edge.keys digest KEY`` prints the digest of an existing key.
"""

from __future__ import annotations

import argparse

from deployments.edge.guard import key_digest, new_key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.edge.keys", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("new", help="print a new key (give it to the caller) and its digest (put it in security.api_key_digests)")
    digest = sub.add_parser("digest", help="print the digest of a key")
    digest.add_argument("key")
    args = parser.parse_args(argv)
    if args.command == "new":
        key, digest_hex = new_key()
        print(f"key:    {key}\ndigest: {digest_hex}")
    else:
        print(key_digest(args.key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
