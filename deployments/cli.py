"""What every operator command shares: one flag per thing, exit codes.

The vocabulary the commands share (README.md, "One vocabulary"): ``--index ROOT`` is an index root a command
reads, ``--out`` what it writes; ``--train-split`` the queries learned or tuned on, ``--test-split`` the queries
measured on, ``--held-out-share`` the share held out of a collection with one split; replica counts are
``num_replicas`` as Serve names them. Usage errors exit with 2 (argparse's code), failures with 1, and both
write to stderr.
"""

from __future__ import annotations

USAGE_ERROR = 2
FAILURE = 1
