# The metering image: the library, the `metering` CLI and the Celery app
# (`workers`). docker-compose.yml runs it as migrate, worker and beat.
#
#   docker build -t metering .
#   docker run --rm -e METERING_DATABASE_URL=... -e METERING_BROKER_URL=... metering
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

# An unprivileged user to run as; its uid is fixed so volumes can be chowned.
RUN groupadd --system --gid 10001 metering \
    && useradd --system --uid 10001 --gid metering --create-home \
        --home-dir /home/metering --shell /usr/sbin/nologin metering

WORKDIR /app

# What the build needs (see .dockerignore): pyproject.toml, README.md (the
# package's readme) and the two packages.
COPY pyproject.toml README.md ./
COPY metering ./metering
COPY workers ./workers
# The source stays root-owned; the directory itself is the user's, for what
# runs here writes into the working directory: celery beat's schedule file,
# and SQLite and the embedded broker when no URLs are set.
RUN pip install --no-cache-dir . \
    && chown metering:metering /app

USER metering

CMD ["metering", "worker"]
