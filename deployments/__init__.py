"""The online side: Ray-free search cores (one module per job) and the Ray Serve deployments over them."""
