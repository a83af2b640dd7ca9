"""Shard replicas spread over the nodes as they join: the layout and its next move (``plan``), the move carried
out through Serve (``mover``), and the signal that lets one chosen replica go (``retire``)."""
