"""What the HTTP API's routes do, without Ray: the router (``deployments.serve.router``) only adapts HTTP and hands
each request to these (builds, judgments, health, batches, a search's record). Above the edge, the search core and
the documents core, which never import it."""
