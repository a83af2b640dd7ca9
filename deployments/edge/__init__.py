"""The HTTP edge, Ray-free: the API's schemas, keys, the front door and load shedding, the error table, the
console's files, the request metrics, and the other end of the wire: a typed Python client of the API
(``client``). The router (``deployments.serve.router``) declares its routes on ``deployments.edge.http.app``;
nothing here imports a Serve deployment."""
