"""Answers with citations from the final results, Ray-free: ``sources`` (the results as numbered sources), ``core``
(checked answers, the engine protocol, the Synthesizer, the choice of engine), ``prompts`` (messages, yes/no
relevance), ``citations``
(markers parsed and checked, quoting), ``service`` (what the Serve deployment serves), and one module per engine:
``extractive``, ``transformers_engine``, ``vllm_engine``."""
