"""What every operator command shares: one flag per thing, with the old spelling of a renamed flag still taken.

The vocabulary the commands share (README.md, "One vocabulary"): ``--index ROOT`` is an index root a command
reads, ``--out`` what it writes; ``--train-split`` the queries learned or tuned on, ``--test-split`` the queries
measured on, ``--held-out-share`` the share held out of a collection with one split; replica counts are
``num_replicas`` as Serve names them. Usage errors exit with 2 (argparse's code), failures with 1, and both
write to stderr.
"""

from __future__ import annotations

import argparse
import sys

USAGE_ERROR = 2
FAILURE = 1


def renamed_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, old: str, new: str) -> None:
    """Take ``old`` as ``new`` (same value, a note on stderr) but keep it out of ``--help``: a script written
    before the rename still runs, and a reader of the help sees one name."""

    class _Renamed(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(f"note: {old} is now {new}", file=sys.stderr)
            setattr(namespace, self.dest, values)

    dest = new.lstrip("-").replace("-", "_")
    parser.add_argument(old, dest=dest, action=_Renamed, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                        **_same_type(parser, dest))


def _same_type(parser, dest: str) -> dict:
    for action in getattr(parser, "_actions", []):
        if action.dest == dest and action.option_strings:
            return {k: v for k, v in (("type", action.type), ("metavar", action.metavar),
                                      ("choices", action.choices)) if v is not None}
    raise ValueError(f"add the new flag for {dest!r} before its old name")
