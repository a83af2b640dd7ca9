"""Documents written through the API: the durable change log, and the fresh segment that makes what it holds
searchable beside the index version until a build folds it in."""
