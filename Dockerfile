# distilembed serving image: FastAPI + onnxruntime + tokenizers + faiss-cpu, no torch.
#   docker build -t distilembed .                      (or: podman build -t distilembed .)
#   docker run --rm -p 8080:8080 -e DISTILEMBED_API_KEY=... distilembed   answers at once: models/default is inside
#   docker build --build-arg EXTRAS=ray -t distilembed-ray .   adds Ray (the compose "ray" profile), still no torch
# It listens on 0.0.0.0: set a key (DISTILEMBED_API_KEY, or DISTILEMBED_READ_KEYS / DISTILEMBED_WRITE_KEYS),
# or every route is open to whoever reaches the port (docs/serving.md, "Deploying securely").
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG EXTRAS=serve
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (a layer that survives code edits), then the project itself.
COPY pyproject.toml README.md ./
COPY scripts/requirements.py /tmp/
RUN python /tmp/requirements.py "$EXTRAS" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
COPY distilembed ./distilembed
COPY export ./export
COPY index ./index
COPY service ./service
COPY training ./training
RUN pip install --no-deps . \
    && python -c "import importlib.util as u, sys; heavy = [m for m in ('torch', 'transformers') if u.find_spec(m)]; sys.exit(f'unexpected in the serving image: {heavy}' if heavy else 0)"

FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DISTILEMBED_HOST=0.0.0.0 \
    DISTILEMBED_PORT=8080 \
    DISTILEMBED_BUNDLE=/opt/distilembed/models/default
RUN groupadd --system --gid 10001 distilembed \
    && useradd --system --uid 10001 --gid distilembed --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin distilembed \
    && mkdir -p /data \
    && chown distilembed:distilembed /data
COPY --from=build /opt/venv /opt/venv
COPY models/default /opt/distilembed/models/default
WORKDIR /data
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('DISTILEMBED_PORT', '8080'), timeout=2)"]
CMD ["distilembed", "serve"]
