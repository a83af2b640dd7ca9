"""``python -m index_build.versions``: list, activate, roll back, remove, collect or verify the index versions under
a root, a folder or a URL in object storage (the versions themselves: ``index_format.root``)."""

from __future__ import annotations

import sys

from index_format.manifest import IndexMismatch, VersionManifest
from index_format.process import configure_process
from index_format.store import StoreError
from index_format.versions import open_root, read_version_manifest, resolve_version_dir

ROOT_HELP = "the index root: a folder, or a URL in object storage (s3://bucket/prefix)"


def version_manifest(root: str, name: str) -> VersionManifest:
    """A published version's manifest; from a root in object storage, read there (nothing is fetched)."""
    return open_root(root).manifest(name)


def main(argv: list[str] | None = None) -> int:
    """``python -m index_build.versions``: list, activate, remove or verify index versions."""
    import argparse

    from index_format.manifest import verify_shard

    parser = argparse.ArgumentParser(prog="python -m index_build.versions", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="versions under ROOT, the active one marked with *")
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    p = sub.add_parser("activate", help="verify VERSION, then point ROOT/ACTIVE at it (a compare-and-swap); running "
                       "services follow it")
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    p.add_argument("version")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the verification (a folder: every file against its checksum; object storage: the file "
                   "table against the shard manifests); only for a version verified just before")
    p = sub.add_parser("remove", help="delete VERSION (not the active one, nor one a running process holds), then "
                       "the files no version references (unless a build or fold is publishing)")
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    p.add_argument("version")
    p = sub.add_parser("collect", help="delete the files no version references (those a removal left while a build or "
                       "fold was publishing) and the leases their holders left when they died")
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    p = sub.add_parser("rollback", help="activate the version that was active before the current one")
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    p = sub.add_parser("history", help="past activations, oldest first")
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    p = sub.add_parser("verify", help="check every shard's files against its manifest, reading every byte (a version "
                       "in object storage: fetched into this node's cache first)")
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    p.add_argument("version", nargs="?")
    args = parser.parse_args(argv)
    configure_process()
    try:
        root = open_root(args.root)
        if args.command == "list":
            live = root.active()
            for name in root.versions():
                m = version_manifest(args.root, name)
                named = "".join(f" + {n} ({e.encoder})" for n, e in m.encoders.items())
                print(f"{'*' if name == live else ' '} {name}  {m.counts['docs']:>9,} docs {m.counts['chunks']:>10,} chunks"
                      f"  {m.num_shards} shards  {m.encoder}{named}  {m.created}")
        elif args.command == "activate":
            previous = root.activate(args.version, verify=not args.no_verify)
            if previous == args.version:
                print(f"{args.version} is already the active version")
            else:
                print(f"active version: {args.version} (was {previous or 'none'}); running services switch once "
                      "their shards have loaded it")
        elif args.command == "rollback":
            was, now = root.rollback()
            print(f"rolled back: active version {now} (was {was})")
        elif args.command == "history":
            for entry in root.history():
                print(f"{entry['time']}  {entry['version']}  (was {entry.get('previous') or 'none'}, by {entry.get('by')})")
        elif args.command == "remove":
            print(f"removed {args.version}; {_collected(root.remove(args.version))}")
        elif args.command == "collect":
            print(_collected(root.collect_garbage()))
        else:
            folder = resolve_version_dir(args.root, args.version)
            m = read_version_manifest(folder)
            for shard in m.shards:
                verify_shard(folder / "shards" / shard, expect=m.shard_expect(), remembered=False)
            print(f"{folder.name}: {len(m.shards)} shards verified")
    except (IndexMismatch, ValueError, StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _collected(done: dict) -> str:
    if not done["collected"]:
        return f"files kept: {done['why']}"
    return f"{done['files_deleted']} files no version references deleted"


if __name__ == "__main__":
    raise SystemExit(main())
