"""Ray Serve deployments: thin wrappers that own a resource (an index group, a model) and call a core."""
