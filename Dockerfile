# The pdexporter image: `docker build -t pdexporter:0.1.0 .`, then `docker run pdexporter:0.1.0 run --decode-batch-size 4 --target http://vllm:8000`.
# Reproducible builds pin the base image by digest, so a re-pushed python:3.11-slim tag cannot
# change what is built: `docker build --build-arg BASE_DIGEST=sha256:<64 hex> ...` (the digest
# from `docker buildx imagetools inspect python:3.11-slim`). Empty: the tag as it is today.
ARG BASE_IMAGE=python:3.11-slim
ARG BASE_DIGEST=
FROM ${BASE_IMAGE}${BASE_DIGEST:+@${BASE_DIGEST}}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp

WORKDIR /opt/pdexporter
COPY pyproject.toml README.md* ./
COPY pdexporter ./pdexporter
RUN pip install --no-compile . \
 && rm -rf /opt/pdexporter/build

# uid/gid 10001: the Helm chart's runAsUser/runAsGroup; no home, no shell login, owns nothing it runs.
RUN groupadd --system --gid 10001 pdexporter \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pdexporter \
 && mkdir -p /results && chown 10001:10001 /results
USER 10001:10001
WORKDIR /results

EXPOSE 18742
ENTRYPOINT ["pdexporter"]
CMD ["run", "--decode-batch-size", "4", "--listen", "0.0.0.0:18742"]
