"""The HTTP edge, Ray-free: the API's schemas, keys, the front door and load shedding, the error table, the
console's files and the request metrics. The router (``deployments.serve.router``) declares its routes on
``deployments.edge.http.app``; nothing here imports a Serve deployment."""
