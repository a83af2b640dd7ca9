"""The request path without Ray: pipeline, fusion, MMR, context, query text, spelling, activation, the front door's rules, reranking and synthesis cores, and the whole pipeline in one process."""
