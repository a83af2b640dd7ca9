# The service's image: the README's own setup (`make setup`) in a Debian Python 3.11, with a JDK so the
# BM25 helper compiles (without one BM25 runs through pyjnius proxies, about 1 ms more a shard).
#
#   docker build -t raysearch:cpu .
#   docker build -t raysearch:gpu --build-arg VARIANT=gpu .     # faiss-gpu-cu12 and the gpu extra (vLLM)
#   docker run -p 8000:8000 -p 8080:8080 -v /path/to/indexes:/indexes raysearch:cpu
#
# Models are not downloaded at run time: the shipped MiniLM encoder is in the image; mount others under
# /models and name them by path. deploy/rayservice.yaml runs this image on KubeRay.
FROM python:3.11-slim-bookworm

ARG VARIANT=cpu
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make openjdk-17-jdk-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt pyproject.toml Makefile README.md ./
COPY deployments deployments
COPY index_format index_format
COPY index_build index_build
COPY relevance relevance
COPY demo demo
COPY serve_config.yaml ./
RUN make setup PYTHON=python3.11 \
    && if [ "$VARIANT" = gpu ]; then \
         .venv/bin/python -m pip uninstall -y faiss-cpu \
         && .venv/bin/python -m pip install --no-cache-dir -e ".[gpu]"; \
       fi \
    && rm -rf /root/.cache/pip

ENV PATH=/app/.venv/bin:$PATH \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled OPENAI_API_KEY=unused TOKENIZERS_PARALLELISM=false
EXPOSE 8000 8080
# One index root mounted at /indexes/docs; metrics (Prometheus) on 8080.
CMD ["python", "-m", "deployments", "--index", "/indexes/docs", "--host", "0.0.0.0", "--port", "8000"]
