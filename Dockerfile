# syntax=docker/dockerfile:1
# gpufeed container image: build stage installs the package into a venv; the final stage is
# python:slim plus that venv, non-root, no compilers, no pip. See docs/deployment.md#docker for the
# flags it needs at run time (--pid=host, /proc and /sys mounts, --gpus).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The NVML binding the image ships, pinned: pyproject.toml only sets its floor (issue 38: older bindings
# scramble process pids), and tests/gpu/test_binding_floor.py keeps this pin at or above that floor.
ARG NVIDIA_ML_PY_VERSION=13.615.71

FROM ${PYTHON_IMAGE} AS build
ARG NVIDIA_ML_PY_VERSION
# Optional extras, e.g. --build-arg GPUFEED_EXTRAS=capture for py-spy (--capture.enabled, docs/deployment.md).
ARG GPUFEED_EXTRAS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/gpufeed
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY exporter ./exporter
# What the package ships besides its code (setup.py, `gpufeed examples`): scenarios, rules, dashboards, runbooks.
COPY tests/scenarios/*.yaml ./tests/scenarios/
COPY alerts/gpufeed-*.yml ./alerts/
COPY deploy/grafana/dashboards/*.json ./deploy/grafana/dashboards/
COPY docs/runbooks.md ./docs/
# Wheels only: a dependency that would need a compiler fails here instead of dragging one in.
RUN /opt/gpufeed/bin/pip install --only-binary=:all: --no-compile ".${GPUFEED_EXTRAS:+[$GPUFEED_EXTRAS]}" "nvidia-ml-py==${NVIDIA_ML_PY_VERSION}" \
    && /opt/gpufeed/bin/pip uninstall --yes pip setuptools \
    && /opt/gpufeed/bin/gpufeed --version

FROM ${PYTHON_IMAGE}
# libudev1: pyudev's PCIe hotplug events (the daemon falls back to polling without it).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 gpufeed \
    && useradd --system --uid 10001 --gid gpufeed --groups video --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpufeed
COPY --from=build /opt/gpufeed /opt/gpufeed
ENV PATH=/opt/gpufeed/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    GPUFEED_HEALTHZ_URL=http://127.0.0.1:9842/healthz
USER 10001:10001
EXPOSE 9842
# Python, not curl: the image has no curl. Override GPUFEED_HEALTHZ_URL with --web.listen-address.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; r = urllib.request.urlopen(os.environ['GPUFEED_HEALTHZ_URL'], timeout=3); sys.exit(0 if r.status == 200 else 1)"]
ENTRYPOINT ["gpufeed", "serve"]
CMD ["--path.procfs=/host/proc", "--path.sysfs=/host/sys"]
