# syntax=docker/dockerfile:1
# backburner: one image for the API and the workers (the command picks the role).
#
#   docker build -t backburner .                  # [redis,otel]: API + workers on Redis
#   docker build -t backburner:local --build-arg LOCAL=1 .   # + [local]: llama.cpp and
#                                                 # Gemma 3 270M (compiles ~5 min)
#   docker run -p 8000:8000 -e BACKBURNER_API_KEYS=acme:sha256:<hex> backburner
#                                                 # the API (SQLite in /data by default; it
#                                                 # refuses to serve keyless beyond loopback)
#   docker run backburner backburner worker --backend redis://redis:6379/0
#
# See docs/deploy.md.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG LOCAL=0
# A compiler only when llama-cpp-python must be built; it stays in this stage.
RUN if [ "$LOCAL" = "1" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends build-essential cmake \
        && rm -rf /var/lib/apt/lists/*; \
    fi
RUN python -m venv /opt/venv
# CMAKE_ARGS: llama.cpp tunes itself to the build machine's CPU by default; an image runs
# elsewhere.
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CMAKE_ARGS="-DGGML_NATIVE=OFF"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY backburner ./backburner
RUN if [ "$LOCAL" = "1" ]; then extras="redis,otel,local"; else extras="redis,otel"; fi \
    && pip install ".[$extras]"

FROM python:${PYTHON_VERSION}-slim
ARG LOCAL=0
# llama.cpp's OpenMP runtime, only for the [local] image.
RUN if [ "$LOCAL" = "1" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends libgomp1 \
        && rm -rf /var/lib/apt/lists/*; \
    fi
# A numeric uid, so Kubernetes' runAsNonRoot can verify it without a lookup.
RUN groupadd --gid 10001 backburner \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin backburner \
    && mkdir /data \
    && chown backburner:backburner /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    BACKBURNER_LOG_FORMAT=json
USER 10001:10001
# The default SQLite file (sqlite:///backburner.db) lands here; mount a volume to keep it.
WORKDIR /data
EXPOSE 8000
# GET /healthz of the API. A worker has no HTTP API: give it --metrics-port and set
# HEALTHCHECK_URL=http://127.0.0.1:9101/healthz (deploy/docker-compose.yml does).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('HEALTHCHECK_URL', 'http://127.0.0.1:8000/healthz'), timeout=4)"]
# Exec form: the process is PID 1 and gets SIGTERM itself (a worker's graceful shutdown).
CMD ["backburner", "api", "--host", "0.0.0.0"]
