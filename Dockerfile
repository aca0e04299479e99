# fleetbench's Airflow image for docker-compose.yaml: the official Airflow image, the pinned
# requirements (requirements.txt: Airflow, the docker/ssh/celery providers, ...), the docker CLI
# (host probes: `docker version`, `docker info`, the GPU smoke container) and the fleetbench
# package itself. dags/, plugins/ and include/ are also mounted by the compose file, so code edits
# need no rebuild; requirements.txt edits do (`docker compose build`).
#
#   docker compose build        # or: docker build -t fleetbench-airflow:3.3.2 .
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
ARG DOCKER_CLI_IMAGE=docker:27-cli

FROM ${DOCKER_CLI_IMAGE} AS docker-cli

FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION

# The docker CLI only (no engine): workers talk to the fleet's engines, local socket or tcp + TLS.
COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker

# As the official image documents: install as the airflow user, pin Airflow itself so pip cannot
# move it while resolving the other requirements, and install with the constraints of the pinned
# version: requirements.lock, the set requirements.txt resolved to (scripts/lock-requirements.sh),
# in place of Airflow's published constraints file (README "Installing: pinned versions").
USER airflow
COPY --chown=airflow:0 requirements.txt requirements.lock /opt/airflow/
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/airflow/requirements.txt \
    -c /opt/airflow/requirements.lock

# The fleetbench package (editable: the mounted include/ is the code that runs).
COPY --chown=airflow:0 pyproject.toml README.md /opt/airflow/
COPY --chown=airflow:0 include /opt/airflow/include
RUN pip install --no-cache-dir --no-deps -e /opt/airflow \
    && fleetbench --help >/dev/null
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins
# The artifacts folder (a named volume in docker-compose.yaml): a new volume takes this folder's owner.
RUN mkdir -p /opt/airflow/fleetbench-data
